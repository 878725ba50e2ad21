#!/usr/bin/env python3
"""The CPU step's elementwise loops compile to packed instructions (a Release build's guard).

On AVX2 (Zen 2/3), without -fno-trapping-math, GCC could not if-convert a loop whose select
guards a multiply or divide, and the CPU AdamW update and GELU ran one element at a time
(docs/benchmarks.md, "AVX2 machines"). This reads the disassembly of two such loops' OpenMP
bodies (nm finds them, objdump prints them) and asks for packed arithmetic: a packed double
square root in AdamW's update, packed single-precision arithmetic in GELU's backward. A scalar
remainder loop may sit beside the packed one; only the packed form's absence fails.

  cpu_loops_vectorised.py BUILD_DIR BUILD_TYPE     (exit 77, a skip, unless BUILD_TYPE is Release)
"""
import re
import subprocess
import sys


def bodies(lib, pattern):
    """The instruction mnemonics of each OpenMP body in lib whose symbol matches pattern."""
    syms = [line.split()[-1] for line in subprocess.run(
        ["nm", lib], capture_output=True, text=True, check=True).stdout.splitlines()
        if "_omp_fn" in line and re.search(pattern, line)]
    out = {}
    for sym in syms:
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "--disassemble=" + sym, lib],
                              capture_output=True, text=True, check=True).stdout
        out[sym] = [parts[1] for parts in (l.split("\t") for l in text.splitlines())
                    if len(parts) > 1 and parts[1].strip()]
    return out


def main():
    build, build_type = sys.argv[1], sys.argv[2]
    if build_type != "Release":
        print("skip: the vectorisation guard reads a Release build (this is %r)" % build_type)
        return 77
    checks = [
        ("AdamW's update", build + "/optim/libengine_optim.so", r"CpuAdamWOps6update",
         re.compile(r"^v?sqrtpd\b")),
        ("GELU's backward", build + "/core/libengine_core.so", r"gelu_backward",
         re.compile(r"^v?(mul|add|sub|div|vfn?m(add|sub)\d*)ps\b")),
    ]
    failed = 0
    for name, lib, pattern, packed in checks:
        found = bodies(lib, pattern)
        if not found:
            print("FAIL: %s: no OpenMP body matching %r in %s" % (name, pattern, lib))
            failed += 1
            continue
        for sym, insns in found.items():
            n = sum(1 for i in insns if packed.match(i.strip()))
            print("%s: %d packed of %d instructions in %s" % (name, n, len(insns), sym[:80]))
            if n == 0:
                print("FAIL: %s runs one element at a time (no %s)" % (name, packed.pattern))
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
