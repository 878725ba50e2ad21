#!/usr/bin/python3
"""tools/cuda_resources.py's reading of a ptxas report (-Xptxas -v), on a report written here:
two kernels at two architectures, one with static shared memory, one spilling. Checked: the rows
(registers, smem, stack, spills per kernel and architecture), the demangled short names, the
summary, --json, and --fail-on-spill's exit status with and without a spill.

    cuda_resources_test.py REPO WORK
"""
import json
import os
import shutil
import subprocess
import sys

repo, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
script = os.path.join(repo, "tools/cuda_resources.py")

# What ptxas prints for a template kernel in an anonymous namespace and a plain one.
TILE = ("_ZN4core11cuda_detail49_GLOBAL__N__d6036e8a_16_attention_mma_cu_ead189d327"
        "flash_backward_q_mma_kernelINS1_9Tf32TilesELi128ENS_4bf16EEEvPT1_PKfS8_S8_S8_S8_S8_"
        "llfNS_13AttentionMaskENS_15AttentionLayoutE")
Q = "flash_backward_q_mma_kernel<Tf32Tiles, 128, bf16>"
ADD = "_ZN4core10add_kernelEPfPKfS2_l"
REPORT = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '{tile}' for 'sm_80'
ptxas info    : Function properties for {tile}
    8 bytes stack frame, 40 bytes spill stores, 36 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 16384 bytes smem, 400 bytes cmem[0]
ptxas info    : Compile time = 3194.110 ms
ptxas info    : Compiling entry function '{tile}' for 'sm_90'
ptxas info    : Function properties for {tile}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 232 registers, used 1 barriers, 16384 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function '{add}' for 'sm_90'
ptxas info    : Function properties for {add}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 26 registers, used 0 barriers, 384 bytes cmem[0]
"""


def check(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)


def run(*args):
    return subprocess.run(["/usr/bin/python3", script] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


log = os.path.join(work, "ptxas.log")
open(log, "w").write(REPORT.format(tile=TILE, add=ADD))
p = run("--parse", log, "--json")
check(p.returncode == 0, "--json: " + p.stdout)
rows = [json.loads(l) for l in p.stdout.splitlines()]
check(len(rows) == 3, "rows: %d" % len(rows))
by = {(r["name"], r["arch"]): r for r in rows}
check(set(by) == {("add_kernel", "sm_90"), (Q, "sm_80"), (Q, "sm_90")},
      "names: %s" % sorted(by))
t80 = by[(Q, "sm_80")]
check((t80["registers"], t80["smem"], t80["stack"], t80["spill_stores"], t80["spill_loads"]) ==
      (255, 16384, 8, 40, 36), "sm_80 tile: %s" % t80)
t90 = by[(Q, "sm_90")]
check((t90["registers"], t90["smem"], t90["spill_stores"]) == (232, 16384, 0),
      "sm_90 tile: %s" % t90)
add = by[("add_kernel", "sm_90")]
check((add["registers"], add["smem"]) == (26, 0), "add: %s" % add)

p = run("--parse", log)
check(p.returncode == 0, "table: " + p.stdout)
check("3 kernels x architectures; 1 spill (%s sm_80); most registers: 255 (%s, sm_80)" % (Q, Q)
      in p.stdout, "summary: " + p.stdout)
check("| `%s` | sm_80 | 255 | 16384 | 8 | 40 / 36 |" % Q in p.stdout, "row: " + p.stdout)

check(run("--parse", log, "--fail-on-spill").returncode == 1, "--fail-on-spill with a spill")
clean = os.path.join(work, "clean.log")
open(clean, "w").write(REPORT.format(tile=TILE, add=ADD).replace(
    "8 bytes stack frame, 40 bytes spill stores, 36 bytes spill loads",
    "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"))
check(run("--parse", clean, "--fail-on-spill").returncode == 0, "--fail-on-spill without one")
print("cuda_resources: rows, names, summary, --json and --fail-on-spill as expected")
