#!/usr/bin/python3
"""What each CUDA kernel of a build takes from the GPU, from ptxas: registers, static shared
memory, stack, spills, per architecture (issue 46: checked here, without a GPU, before the kernels
are timed on one).

usage: cuda_resources.py [--build build] [--arch 80,90] [--only REGEX] [--jobs N] [--json]
                         [--fail-on-spill]
       cuda_resources.py --parse LOG [--json]

Recompiles every .cu file of the build's compile_commands.json (the build's own flags, -o to a
scratch file) for each --arch with ptxas's report (-Xptxas -v), and prints one row per kernel and
architecture: the file, the demangled kernel, registers a thread, static shared memory a block,
stack frame, and spill stores and loads in bytes. A spill puts registers into local memory (the
L1 and HBM): it is where a kernel's registers ran out. The summary names the kernels that spill
and the most registers any kernel takes; a block's threads times its registers must fit the SM's
65536, which at 255 registers (ptxas's most) leaves 256 threads. --fail-on-spill exits 1 when a
kernel spills. --parse reads a saved ptxas report instead of compiling. Compiling is slow (about a
minute a file on 2 cores): the report is for when kernels change, not for every build.
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+)'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:, used \d+ barriers)?(?:, (\d+) bytes smem)?")


def parse(text, source=""):
    """Kernels of one ptxas report: [{file, kernel (mangled), arch, registers, smem, stack,
    spill_stores, spill_loads}], in the report's order."""
    rows, cur = [], None
    for line in text.splitlines():
        m = ENTRY.search(line)
        if m:
            cur = {"file": source, "kernel": m.group(1), "arch": m.group(2), "registers": None,
                   "smem": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0}
            rows.append(cur)
            continue
        if cur is None:
            continue
        m = FRAME.search(line)
        if m:
            cur["stack"], cur["spill_stores"], cur["spill_loads"] = map(int, m.groups())
            continue
        m = USED.search(line)
        if m:
            cur["registers"] = int(m.group(1))
            cur["smem"] = int(m.group(2) or 0)
    return rows


def demangle(names):
    if not names:
        return {}
    p = subprocess.run(["c++filt"], input="\n".join(names), stdout=subprocess.PIPE, text=True)
    out = p.stdout.splitlines() if p.returncode == 0 else names
    return dict(zip(names, out))


def short(kernel):
    """The demangled name without its argument list and the anonymous namespace's tag."""
    name = re.sub(r"\(anonymous namespace\)::|_GLOBAL__N__\w+::", "", kernel)
    depth, cut = 0, len(name)
    for i, c in enumerate(name):  # the parameter list: the first '(' outside template brackets
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    if name.startswith("void "):  # a template's demangled name leads with its return type
        name = name[5:]
    return re.sub(r"\bcore::(cuda_detail::)?", "", name)


def compile_one(entry, archs, scratch):
    args = shlex.split(entry["command"])
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a.startswith("--generate-code") or a.startswith("-gencode"):
            continue
        if a == "-o":
            skip = True
            continue
        out.append(a)
    for arch in archs:
        out.append("--generate-code=arch=compute_%s,code=sm_%s" % (arch, arch))
    out += ["-Xptxas", "-v", "-o", os.path.join(scratch, os.path.basename(entry["file"]) + ".o")]
    p = subprocess.run(out, cwd=entry["directory"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit("cuda_resources: %s did not compile:\n%s" % (entry["file"], p.stdout[-4000:]))
    return parse(p.stdout, os.path.relpath(entry["file"], entry.get("root", "")))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--arch", default="80,90")
    ap.add_argument("--only", default="", help="compile only the .cu files whose path matches")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", action="store_true", help="one JSON object per kernel and arch")
    ap.add_argument("--fail-on-spill", action="store_true")
    ap.add_argument("--parse", metavar="LOG", help="a saved ptxas report instead of compiling")
    a = ap.parse_args()

    if a.parse:
        rows = parse(open(a.parse).read(), os.path.basename(a.parse))
    else:
        db = os.path.join(a.build, "compile_commands.json")
        if not os.path.exists(db):
            sys.exit("cuda_resources: %s: no compile_commands.json (configure with CUDA first)"
                     % db)
        root = os.path.dirname(os.path.abspath(__file__ + "/.."))
        entries = [dict(e, root=root) for e in json.load(open(db)) if e["file"].endswith(".cu")
                   and re.search(a.only, e["file"])]
        if not entries:
            sys.exit("cuda_resources: no .cu file in %s%s"
                     % (db, " matches " + a.only if a.only else ""))
        archs = [x for x in a.arch.split(",") if x]
        rows = []
        with tempfile.TemporaryDirectory() as scratch, \
                concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as pool:
            for r in pool.map(lambda e: compile_one(e, archs, scratch), entries):
                rows += r
    names = demangle(sorted({r["kernel"] for r in rows}))
    for r in rows:
        r["name"] = short(names.get(r["kernel"], r["kernel"]))
    rows.sort(key=lambda r: (r["file"], r["name"], r["arch"]))

    spilling = [r for r in rows if r["spill_stores"] or r["spill_loads"]]
    if a.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print("| file | kernel | arch | registers | smem (B) | stack (B) "
              "| spill stores / loads (B) |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
        for r in rows:
            print("| %s | `%s` | %s | %s | %d | %d | %d / %d |" % (
                r["file"], r["name"], r["arch"], r["registers"], r["smem"], r["stack"],
                r["spill_stores"], r["spill_loads"]))
        most = max(rows, key=lambda r: r["registers"] or 0) if rows else None
        which = ", ".join("%s %s" % (r["name"], r["arch"]) for r in spilling)
        print("\n%d kernels x architectures; %d spill%s; most registers: %s" % (
            len(rows), len(spilling), " (%s)" % which if spilling else "",
            "%d (%s, %s)" % (most["registers"], most["name"], most["arch"]) if most else "-"))
    return 1 if a.fail_on_spill and spilling else 0


if __name__ == "__main__":
    sys.exit(main())
