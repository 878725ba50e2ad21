#!/usr/bin/env python3
"""Fails when an include runs up the floors. The repository root is on every target's include
path (each include is written "floor/file.h"), so a header-only include of a floor above
compiles and links; this reads every source and header of each floor and names the file and
line of each include of a floor it may not see (docs/DESIGN.md, "The floors").

usage: floor_includes.py REPO_DIR
"""
import os
import re
import sys

# The floors each floor may include: itself and those below it.
ALLOWED = {
    "core": {"core"},
    "comm": {"comm", "core"},
    "data": {"data", "core"},
    "model": {"model", "core"},
    "optim": {"optim", "comm", "core"},
    "engine": {"engine", "model", "optim", "data", "comm", "core"},
    "apps": {"apps", "engine", "model", "optim", "data", "comm", "core"},
}
SOURCE_SUFFIXES = (".h", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"/]+)/')


def upward_includes(repo):
    bad = []
    checked = 0
    for floor, allowed in ALLOWED.items():
        for d, dirs, names in os.walk(os.path.join(repo, floor)):
            dirs[:] = sorted(x for x in dirs if not x.startswith("."))
            for name in sorted(names):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(d, name)
                checked += 1
                with open(path, encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if m and m.group(1) in ALLOWED and m.group(1) not in allowed:
                            bad.append("%s:%d: %s includes %s/, a floor above it" %
                                       (os.path.relpath(path, repo), n, floor, m.group(1)))
    return checked, bad


def main():
    checked, bad = upward_includes(sys.argv[1])
    if bad:
        print("includes that run up the floors:\n" + "\n".join(bad))
        return 1
    print("%d sources and headers, every include runs down the floors" % checked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
