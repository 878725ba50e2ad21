#!/usr/bin/env python3
"""Keeps the README and the docs/ pages true to the repository:

- every relative link of README.md, docs/*.md and the experiments' and tools' READMEs (`[text](path)`, `![alt](path)`, with or without
  `#anchor`) names a file or folder that exists, and an anchor names a heading of its page;
- every `docs/...` path the README names, linked or in backticks, exists;
- every command of the README's code blocks starts a script or executable the repository has:
  `scripts/...` files, `build/apps/<app>/<app>` where apps/<app> adds that executable, or a tool
  of the system (mpirun, cmake, ...), whose script argument (python3 X, bash X) must exist too.
  A fenced block marked `text` is printed output, not commands.

Each failure is one line naming the file, the line and what is missing.

usage: docs_links.py REPO_DIR
"""
import glob
import os
import re
import shlex
import sys

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`[^`]*`")
DOCS_PATH = re.compile(r"(?<![\w./-])docs/[\w./-]*")
# Tools a README command may start with besides the repository's own scripts and apps.
SYSTEM_TOOLS = {"mpirun", "srun", "sbatch", "cmake", "ctest", "git", "cp", "zcat", "source",
                "python3", "/usr/bin/python3", "bash"}
SCRIPT_RUNNERS = {"python3", "/usr/bin/python3", "bash"}


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    found, in_fence = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def prose_lines(path):
    """(line number, text) of the lines outside code blocks."""
    in_fence = False
    for n, line in enumerate(open(path, encoding="utf-8").read().split("\n"), 1):
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence or line.startswith("    "):
            continue
        yield n, line


def check_links(repo, path, errors):
    rel = os.path.relpath(path, repo)
    for n, line in prose_lines(path):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part \
                else path
            if not os.path.exists(dest):
                errors.append("%s:%d: link to %s: no such file" % (rel, n, target))
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                errors.append("%s:%d: link to %s: no heading with that anchor" % (rel, n, target))


def check_docs_paths(repo, readme, errors):
    for n, line in prose_lines(readme):
        for p in DOCS_PATH.findall(line):
            p = p.rstrip(".")
            if not os.path.exists(os.path.join(repo, p)):
                errors.append("README.md:%d: names %s, which does not exist" % (n, p))


def command_blocks(readme):
    """(line number, command) of every command of the README's code blocks, continuations joined."""
    lines = open(readme, encoding="utf-8").read().split("\n")
    fence = None  # the open fence's info string
    pending, start = "", 0
    for n, line in enumerate(lines, 1):
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
            continue
        if fence is not None:
            code = line if fence != "text" else None
        else:
            code = line[4:] if line.startswith("    ") else None
        if code is None:
            continue
        if not pending:
            start = n
        pending += code.strip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if pending.strip():
            yield start, pending
        pending = ""


def program_of(words):
    """The program a command runs: past environment assignments and a launcher's options."""
    i = 0
    while i < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i]):
        i += 1
    if i < len(words) and words[i] in ("mpirun", "srun"):
        # A launcher: the program is the first argument that is a path.
        for w in words[i + 1:]:
            if "/" in w and not w.startswith("-"):
                return w, None
        return None, None
    if i >= len(words):
        return None, None
    prog = words[i]
    arg = words[i + 1] if prog in SCRIPT_RUNNERS and i + 1 < len(words) else None
    return prog, arg


def app_exists(repo, path):
    m = re.match(r"^build/apps/([\w-]+)/([\w-]+)$", path)
    if not m or m.group(1) != m.group(2):
        return False
    cmake = os.path.join(repo, "apps", m.group(1), "CMakeLists.txt")
    return os.path.isfile(cmake) and "add_executable(%s " % m.group(1) in open(cmake).read()


def repo_program_exists(repo, path):
    if path.startswith("build/"):
        return app_exists(repo, path)
    return os.path.isfile(os.path.join(repo, path))


def check_commands(repo, readme, errors):
    for n, command in command_blocks(readme):
        try:
            words = shlex.split(command, comments=True)
        except ValueError as e:
            errors.append("README.md:%d: cannot read the command (%s): %s" % (n, e, command))
            continue
        prog, arg = program_of(words)
        if prog is None:
            errors.append("README.md:%d: no program in: %s" % (n, command))
        elif prog in SYSTEM_TOOLS:
            if arg is not None and not repo_program_exists(repo, arg):
                errors.append("README.md:%d: %s runs %s, which the repository does not have"
                              % (n, prog, arg))
        elif not repo_program_exists(repo, prog):
            errors.append("README.md:%d: %s is no script, app or known tool of the repository"
                          % (n, prog))


def main():
    repo = os.path.abspath(sys.argv[1])
    readme = os.path.join(repo, "README.md")
    pages = [readme] + sorted(glob.glob(os.path.join(repo, "docs", "*.md"))) + sorted(
        glob.glob(os.path.join(repo, "experiments", "*.md")) +
        glob.glob(os.path.join(repo, "experiments", "*", "README.md")) +
        glob.glob(os.path.join(repo, "tools", "README.md")))
    errors = []
    for page in pages:
        check_links(repo, page, errors)
    check_docs_paths(repo, readme, errors)
    check_commands(repo, readme, errors)
    if errors:
        print("\n".join(errors))
        return 1
    print("%d pages: every relative link, docs/ path and README command resolves" % len(pages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
