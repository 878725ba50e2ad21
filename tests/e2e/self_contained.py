#!/usr/bin/env python3
"""Fails when a tracked file of the repository refers to a path outside it: the project's shared
folder next to the clone (two dots, then /shared) or its absolute form. Code, tests, scripts,
configs and CMake files must read only what a clone holds (specs in docs/specs, golden data in
tests/fixtures/golden).

usage: self_contained.py REPO_DIR
"""
import os
import subprocess
import sys

# Spelled in two pieces so this file does not match itself.
OUTSIDE = ["..", "/shared"], ["/work", "/shared"]


def tracked_files(repo):
    try:
        out = subprocess.run(["git", "-C", repo, "ls-files", "-z"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, check=True).stdout
        return [f.decode() for f in out.split(b"\0") if f]
    except (OSError, subprocess.CalledProcessError):  # an export without .git: walk it
        files = []
        for d, dirs, names in os.walk(repo):
            # data/ holds the data floor's sources; its subfolders are prepared data sets.
            in_data = os.path.relpath(d, repo) == "data"
            dirs[:] = [x for x in dirs if not x.startswith(".") and not x.startswith("build")
                       and not in_data]
            files += [os.path.relpath(os.path.join(d, n), repo) for n in names]
        return files


def main():
    repo = sys.argv[1]
    needles = ["".join(parts) for parts in OUTSIDE]
    bad = []
    files = tracked_files(repo)
    for rel in files:
        path = os.path.join(repo, rel)
        if not os.path.isfile(path) or os.path.getsize(path) > 50_000_000:
            continue
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            if any(needle in line for needle in needles):
                bad.append("%s:%d: %s" % (rel, n, line.strip()[:160]))
    if bad:
        print("files refer to paths outside the repository:\n" + "\n".join(bad))
        return 1
    print("%d tracked files, none refers to a path outside the repository" % len(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
