#!/usr/bin/env bash
# race_budgets.sh: the runs behind the optimizer race's budget method (issue 50; Wen et al. 2025).
# Tuned AdamW at several budgets on cpu_small, the same config, world size and validation as the
# 150-step race (docs/race/cpu_small_budget150: np 2 x 1 thread, val every 10 on 8192 tokens):
# each budget's learning rate is swept at TUNE_SEED (0.5x, 1x, 2x the 150-step race's tuned
# 0.0005, extended past an edge), a seed that is not reported, then the best rate runs at the
# REPORT_SEEDS. Every run is the whole budget on its own schedule (warm-up 10, linear cool-down
# over the last 40% of its steps). The 150-step runs that the race already finished are copied
# from it (--reuse), not trained again. scripts/race_budget_fit.py turns the results into the
# speedup table.
#
#   scripts/race_budgets.sh            # every budget; resumable: a run with a result.json is skipped
#
# Knobs (environment): BUDGETS ("225 300 150": the new budgets first, the 150-step race having
# tuned runs already), TUNE_SEED (1000), REPORT_SEEDS (1337,1338,1339), BUILD_DIR (build),
# OUT (docs/race: one folder cpu_small_adamw_budget<B> per budget).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
build="${BUILD_DIR:-build}"
out="${OUT:-docs/race}"
for budget in ${BUDGETS:-225 300 150}; do
  reuse=()
  [[ $budget == 150 ]] && reuse=(--reuse docs/race/cpu_small_budget150)
  echo "== AdamW at $budget steps"
  /usr/bin/python3 scripts/optimizer_race.py --config configs/cpu_small.yaml --families adamw \
    --target budget --steps "$budget" --eval-every 10 --np 2 --extend 4 \
    --center adamw=0.0005 --lr-factors 0.5,1,2 \
    --tune-seed "${TUNE_SEED:-1000}" --report-seeds "${REPORT_SEEDS:-1337,1338,1339}" \
    --engine "$build/apps/engine/engine" --out "$out/cpu_small_adamw_budget$budget" "${reuse[@]}"
done
