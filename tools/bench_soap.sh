#!/usr/bin/env bash
# bench_soap.sh: the SOAP family side by side with the reference implementation, in one run.
#
#   tools/bench_soap.sh [--emopt-dir DIR] [--out OUT.jsonl] [--device cpu|cuda]
#                         [--d-model 128] [--layers 4] [--repeat 5] [--warmup 2] [--threads "1 2"]
#
# The reference is NVIDIA-NeMo/Emerging-Optimizers' own SOAP and REKLS (legacy_soap) on PyTorch
# (tools/soap_torch_bench.py), from a checkout outside this repository named by --emopt-dir or
# $EMOPT_DIR (the script says how to get one when it is missing). For each thread count it runs the
# reference, then apps/bench_optim at np 1 with as many OpenMP threads, then bench_optim at np 2 x
# 1 thread (TpRekls' distributed eigh); every rank runs unbound (--bind-to none: Open MPI binds a
# rank to one core at np <= 2 otherwise, and a 2-thread rank then runs on one core). Both sides
# step the same matrices (cpu_small's 16 hidden matrices by default; --d-model 768 --layers 12 is
# GPT-2 124M's) with fresh random gradients every step. Rows go to OUT.jsonl (default
# runs/bench_soap.jsonl), then the tables: step time of each side (wall and CPU ms, CPU / wall =
# cores kept busy) and reference / engine; where the engine's step time goes; the refresh alone,
# one at a time / batched. The machine should be quiet: on a loaded one only CPU times mean much.
# --device cuda runs both sides on the GPU (threads: 1). PYTHON names the interpreter with PyTorch
# (default /usr/bin/python3, Debian's python3-torch).
set -euo pipefail
python="${PYTHON:-/usr/bin/python3}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo/runs/bench_soap.jsonl"
emopt="${EMOPT_DIR:-}"
device=cpu
threads="1 2"
shape=()
repeat=5
warmup=2
while [ $# -gt 0 ]; do
  case "$1" in
    --emopt-dir) emopt="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --d-model|--layers) shape+=("$1" "$2"); shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --help|-h) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "bench_soap.sh: unknown argument '$1' (tools/bench_soap.sh --help)" >&2; exit 2 ;;
  esac
done
[ "$device" = cuda ] && threads=1
bench="${BUILD_DIR:-$repo/build}/apps/bench_optim/bench_optim"
if [ ! -x "$bench" ]; then
  echo "bench_soap.sh: $bench is missing: build it (ninja -C build bench_optim)" >&2
  exit 2
fi
# Fails with the instructions when the reference checkout is missing, before anything runs.
"$python" "$repo/tools/soap_torch_bench.py" --emopt-dir "$emopt" --check
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Idle OpenMP threads sleep instead of spinning, on both sides (a loaded machine otherwise starves
# spinning 2-thread runs); set OMP_WAIT_POLICY to override.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
common=(--device "$device" --repeat "$repeat" --warmup "$warmup" "${shape[@]}")
mkdir -p "$(dirname "$out")"
: > "$out"
for t in $threads; do
  OMP_NUM_THREADS=$t "$python" "$repo/tools/soap_torch_bench.py" --emopt-dir "$emopt" \
    --threads "$t" "${common[@]}" >> "$out"
  OMP_NUM_THREADS=$t mpirun --oversubscribe --bind-to none -np 1 "$bench" "${common[@]}" --json \
    >> "$out"
done
OMP_NUM_THREADS=1 mpirun --oversubscribe --bind-to none -np 2 "$bench" "${common[@]}" --json \
  --only tp_rekls >> "$out"
/usr/bin/python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def get(impl, part, what, threads, np=1):
    for r in rows:
        if (r["impl"], r["part"], r["what"], r["threads"], r["np"]) == (impl, part, what, threads, np):
            return r
    return None
threads = sorted({r["threads"] for r in rows if r["np"] == 1})
def cores(r):
    return r["cpu_ms"] / r["ms"] if r["ms"] > 0 else float("nan")

print("\nStep, side by side (ms; cores = CPU / wall)")
print("%-4s %-12s %10s %8s %6s %10s %8s %6s %8s %8s" % ("thr", "optimizer", "ref wall", "ref cpu",
      "cores", "eng wall", "eng cpu", "cores", "x wall", "x cpu"))
for t in threads:
    for what in ("soap qr", "soap eigh", "rekls"):
        ref, eng = get("reference", "step", what, t), get("engine", "step", what, t)
        if not (ref and eng):
            continue
        print("%-4d %-12s %10.1f %8.1f %6.2f %10.1f %8.1f %6.2f %8.2f %8.2f" % (
            t, what, ref["ms"], ref["cpu_ms"], cores(ref), eng["ms"], eng["cpu_ms"], cores(eng),
            ref["ms"] / eng["ms"], ref["cpu_ms"] / eng["cpu_ms"]))
    # The amortized pre-sort (qr_sort: before) has no counterpart in the reference at HEAD.
    eng = get("engine", "step", "soap qr sort before", t)
    if eng:
        print("%-4d %-12s %10s %8s %6s %10.1f %8.1f %6.2f   (engine only: qr_sort before)" % (
            t, "qr before", "", "", "", eng["ms"], eng["cpu_ms"], cores(eng)))

print("\nWhere the engine's step goes (ms; solver and sort sum each factor's time over the threads)")
phases = ("factors", "solver", "sort", "rotate", "update")
print("%-4s %-12s" % ("thr", "optimizer") + "".join(" %16s" % p for p in phases))
for t in threads:
    for what in ("soap qr", "soap qr sort before", "soap eigh", "rekls"):
        cells = [get("engine", "phase", "%s: %s" % (what, p), t) for p in phases]
        if all(cells):
            print("%-4d %-12s" % (t, what.replace("soap qr sort before", "qr before")) + "".join(" %7.1f (%6.1f)" % (c["ms"], c["cpu_ms"])
                                                       for c in cells))
print("     (wall, and CPU in parentheses)")

print("\nThe refresh alone (ms; cores = CPU / wall)")
print("%-4s %-40s %10s %8s %6s" % ("thr", "what", "wall", "cpu", "cores"))
for t in threads:
    for what in ("eigh batched", "eigh one at a time", "eigh() per matrix", "qr batched",
                 "qr one at a time", "qr() per matrix"):
        r = get("engine", "refresh", what, t)
        if r:
            print("%-4d %-40s %10.1f %8.1f %6.2f" % (t, what, r["ms"], r["cpu_ms"], cores(r)))
    for k in ("eigh", "qr"):
        a, b = get("engine", "refresh", k + " one at a time", t), get("engine", "refresh", k + " batched", t)
        if a and b:
            print("%-4d %-40s %10.2f" % (t, k + ": one at a time / batched", a["ms"] / b["ms"]))
for what in ("tp_rekls gather-all", "tp_rekls distributed_eigh"):
    r = get("engine", "step", what, 1, 2)
    if r:
        print("np 2 %-40s %10.1f %8.1f %6.2f" % ("step " + what, r["ms"], r["cpu_ms"], cores(r)))
PY
