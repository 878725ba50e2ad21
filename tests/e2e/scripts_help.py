"""Every script a user or developer runs (scripts/, tools/, experiments/*/) answers --help: exit
status 0, its usage on stdout, at once and without doing any of its work (prepare_data.sh once
took --help for its build folder and began fetching and building)."""
import glob
import os
import subprocess
import sys
import tempfile

# Not run by hand: a module the scripts import, and the rsh agent Open MPI calls.
NOT_COMMANDS = {"scripts/runlog.py", "tools/netns_agent.sh"}


def main():
    repo = sys.argv[1]
    scripts = []
    for pattern in ("scripts/*.sh", "scripts/*.py", "tools/*.sh", "tools/*.py",
                    "experiments/*/*.sh", "experiments/*/*.py"):
        scripts += sorted(glob.glob(os.path.join(repo, pattern)))
    failures = []
    for path in scripts:
        rel = os.path.relpath(path, repo)
        if rel in NOT_COMMANDS or os.path.basename(path).startswith("_"):
            continue
        cmd = (["/usr/bin/python3", path] if path.endswith(".py") else ["bash", path]) + ["--help"]
        with tempfile.TemporaryDirectory() as cwd:
            try:
                p = subprocess.run(cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, timeout=20)
            except subprocess.TimeoutExpired:
                failures.append("%s --help: still running after 20 s (it does its work)" % rel)
                continue
            left = os.listdir(cwd)
        if p.returncode != 0 or len(p.stdout.strip()) < 20:
            failures.append("%s --help: status %d, stdout %r, stderr %r" %
                            (rel, p.returncode, p.stdout[:200], p.stderr[-300:]))
        elif left:
            failures.append("%s --help wrote %s into its working folder" % (rel, left))
    for f in failures:
        print(f)
    print("%d scripts answer --help" % (len(scripts) - len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
