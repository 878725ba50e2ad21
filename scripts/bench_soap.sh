#!/usr/bin/env bash
# bench_soap.sh [OUT.jsonl]: the SOAP-family benchmark, side by side in one run: the PyTorch
# rendering of the spec (scripts/soap_torch_bench.py) and apps/bench_optim at np 1 (1 and 2
# threads) and np 2 (1 thread each), then the ratios the issue asks for. Timings on a shared
# machine are only meaningful as such side-by-side ratios; CPU time (cpu_ms) is steadier than
# wall time when the machine is oversubscribed. Every rank runs unbound (--bind-to none), as the
# torch runs do: Open MPI's default at np <= 2 binds a rank to one core, so a 2-thread rank ran its
# threads on that one core (CPU time equal to wall time) and np 2 x 1 thread compared two cores
# with one.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$repo/runs/bench_soap.jsonl}"
bench="$repo/build/apps/bench_optim/bench_optim"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Idle OpenMP threads sleep instead of spinning: on an oversubscribed machine spinning threads
# of a 2-thread run starve each other (a 2-thread torch run then takes minutes per step).
export OMP_WAIT_POLICY=PASSIVE
mkdir -p "$(dirname "$out")"
: > "$out"
for t in 1 2; do
  /usr/bin/python3 "$repo/scripts/soap_torch_bench.py" --threads "$t" --repeat 3 --warmup 1 >> "$out"
  OMP_NUM_THREADS=$t mpirun --oversubscribe --bind-to none -np 1 "$bench" --repeat 3 --warmup 1 --json >> "$out"
done
OMP_NUM_THREADS=1 mpirun --oversubscribe --bind-to none -np 2 "$bench" --repeat 3 --warmup 1 --json >> "$out"
/usr/bin/python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def get(impl, what, threads, np=1, part=None):
    for r in rows:
        if r["impl"] == impl and r["what"] == what and r["threads"] == threads and \
           r.get("np", 1) == np and (part is None or r.get("part") == part):
            return r
    return None
print("%-58s %10s %10s" % ("ratio (side by side, same run)", "wall", "cpu"))
def ratio(label, a, b):
    if a and b:
        print("%-58s %10.2f %10.2f" % (label, a["ms"] / b["ms"], a["cpu_ms"] / b["cpu_ms"]))
for t in (1, 2):
    for w in ("soap qr", "soap eigh", "rekls"):
        ours = w + " batched" if w.startswith("soap") else w
        ratio("torch / engine step, %s, %d thread(s)" % (w, t), get("torch", w, t),
              get("engine", ours, t, part="step"))
for t in (1, 2):
    for k in ("eigh", "qr"):
        ratio("refresh %s: one at a time / batched, %d thread(s)" % (k, t),
              get("engine", k + " one at a time", t), get("engine", k + " batched", t))
        ratio("refresh %s: threaded LAPACK per matrix / batched, %d thr" % (k, t),
              get("engine", k + " threaded LAPACK per matrix", t), get("engine", k + " batched", t))
ratio("tp_rekls double eigh: gather-all / distributed, np 2",
      get("engine", "tp_rekls double eigh gather-all", 1, 2),
      get("engine", "tp_rekls double eigh distributed_eigh", 1, 2))
ratio("tp_rekls step: gather-all / distributed, np 2",
      get("engine", "tp_rekls gather-all", 1, 2), get("engine", "tp_rekls distributed_eigh", 1, 2))
PY
