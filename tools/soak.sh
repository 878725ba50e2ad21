#!/usr/bin/env bash
# Soak with random kills: one training run at np N killed at random moments (SIGKILL of one rank,
# of every rank, SIGTERM, each also aimed at the moment a checkpoint is being written) and resumed
# with checkpoint.resume=auto, again and again, until --kills kills and --minutes minutes are
# done; then it runs to its end. Checked: after every kill each step_* checkpoint is complete and
# read whole by the engine's reader, no interrupted save outlives the next save, the checkpoint
# folder stays within checkpoint.keep + 2 checkpoints; at the end metrics.jsonl holds every step
# once and its losses, gradient norms and lr equal, bit for bit, those of one uninterrupted run of
# the same config and steps (tests/e2e/soak.py says how).
#
#   tools/soak.sh [--kills 10] [--minutes 0] [--seed S (drawn and printed)] [--np 4]
#                   [--out build/soak] [--config configs/tiny.yaml] [--steps 200]
#                   [--every 1 (checkpoint.every)] [--keep 3 (checkpoint.keep)]
#                   [--max-steps-per-round 4] [--build build | --engine PATH]
#                   [--set KEY=VALUE ...] [--json]
#
# The schedule (kind, steps and moment of each kill) follows from the seed; the summary line
# names it. Exit status 0 only when every check held and the kills and minutes asked for were
# done; a run that reaches its last step first needs more --steps. The run reads the tiny token
# shards (generated under --out); --engine must be named `engine` (the ranks are found by that
# name). Each rank runs 1 OpenMP thread unless OMP_NUM_THREADS says otherwise; mpirun
# oversubscribes.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build="$repo/build" engine="" args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    --engine) engine=$2; shift 2 ;;
    --json) args+=("$1"); shift ;;
    --kills|--minutes|--seed|--np|--out|--config|--steps|--every|--keep|--max-steps-per-round|--set)
      [ $# -ge 2 ] || { echo "soak: $1 needs a value" >&2; exit 2; }
      args+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak: unknown argument '$1' (tools/soak.sh --help)" >&2; exit 2 ;;
  esac
done
engine=${engine:-$build/apps/engine/engine}
[ -x "$engine" ] || { echo "soak: no engine at $engine (build first)" >&2; exit 2; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec python3 "$repo/tests/e2e/soak.py" --engine "$engine" --config "$repo/configs/tiny.yaml" \
  --out "$build/soak" "${args[@]}"
