#!/usr/bin/env bash
# race_budgets.sh: the runs behind the optimizer race's budget method (issue 50; Wen et al. 2025).
# The same config, world size and validation as the 150-step race (docs/race/cpu_small_budget150:
# cpu_small, np 2 x 1 thread, val every 10 on 8192 tokens), every learning rate picked at
# TUNE_SEED, a seed that is not reported, and the picked rate then run at the REPORT_SEEDS:
#   1. tuned AdamW at each of BUDGETS (docs/race/cpu_small_adamw_budget<B>): swept at 0.5x, 1x
#      and 2x the 150-step race's tuned 0.0005, extended past an edge. Every run is its whole
#      budget on its own schedule (warm-up 10, linear cool-down over the last 40% of its steps);
#   2. the 150-step race of every family again, each swept around its tuned rate of that race
#      (docs/race/cpu_small_budget150_tune1000; AdamW's 150-step budget point); runs that the
#      race already finished are copied from it (--reuse), not trained again.
# The runs share the machine with other work, so their tables leave times out (--no-times).
# scripts/race_budget_fit.py turns the results into the speedup table.
#
#   scripts/race_budgets.sh            # resumable: a run with a result.json is skipped
#
# Knobs (environment): BUDGETS ("225 300"), TUNE_SEED (1000), REPORT_SEEDS (1337,1338,1339),
# BUILD_DIR (build), OUT (docs/race).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
build="${BUILD_DIR:-build}"
out="${OUT:-docs/race}"
tune_seed="${TUNE_SEED:-1000}"
race() {
  /usr/bin/python3 scripts/optimizer_race.py --config configs/cpu_small.yaml --target budget \
    --eval-every 10 --np 2 --extend 4 --lr-factors 0.5,1,2 --tune-seed "$tune_seed" \
    --report-seeds "${REPORT_SEEDS:-1337,1338,1339}" --no-times --engine "$build/apps/engine/engine" "$@"
}
for budget in ${BUDGETS:-225 300}; do
  echo "== AdamW at $budget steps"
  race --families adamw --steps "$budget" --center adamw=0.0005 --out "$out/cpu_small_adamw_budget$budget"
done
echo "== every family at 150 steps, tuned on seed $tune_seed"
race --steps 150 --center adamw=0.0005,muon=0.005,normuon=0.005,soap=0.001,rekls=0.002 \
  --reuse docs/race/cpu_small_budget150 --out "$out/cpu_small_budget150_tune$tune_seed"
