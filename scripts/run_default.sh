#!/usr/bin/env bash
# run_default.sh: the default run from a fresh checkout, end to end.
#   1. installs the system packages (scripts/setup.sh);
#   2. configures and builds (BUILD_DIR, default build);
#   3. prepares the Brown corpus shards (scripts/prepare_data.sh; idempotent);
#   4. trains the current CPU record recipe (configs/speedrun_cpu.yaml; docs/records.md) with its
#      schedule fitted to 240 steps, about 3 minutes, on 2 MPI ranks (1 OpenMP thread each; NP and
#      OMP_NUM_THREADS override), with checkpoints; extra arguments go to the engine
#      (e.g. --set train.steps=50);
#   5. plots the loss curve to runs/speedrun_cpu/loss.png.
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then  # the header above is the usage
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" | sed '/^#!/d;/^set -/d'
  exit 0
fi
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
build="${BUILD_DIR:-build}"
np="${NP:-2}"

bash scripts/setup.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" --parallel "$(nproc)" --target engine tokenize
bash scripts/prepare_data.sh "$build"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Several threads per rank need as many cores: Open MPI binds each rank to one core at np <= 2.
bind=()
if ((OMP_NUM_THREADS > 1)); then bind=(--bind-to none); fi
# Each run of the default job starts afresh in runs/speedrun_cpu (the engine refuses a fresh start
# over an earlier run unless told to overwrite it); `--set checkpoint.resume=auto` continues it.
# The record's stop at its target is off: a 240-step schedule does not reach it.
mpirun --oversubscribe "${bind[@]}" -np "$np" "$build/apps/engine/engine" --config configs/speedrun_cpu.yaml \
  --set train.steps=240 --set train.target_val_loss=0 --set checkpoint.every=80 \
  --set checkpoint.at_end=true --set checkpoint.overwrite=true "$@"

/usr/bin/python3 scripts/plot_loss.py runs/speedrun_cpu/loss.png \
  runs/speedrun_cpu/metrics.jsonl:speedrun_cpu --title "CPU record recipe, 240 steps, $np ranks"
