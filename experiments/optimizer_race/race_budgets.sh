#!/usr/bin/env bash
# race_budgets.sh: the runs behind the optimizer race's budget method (issue 50; Wen et al. 2025).
# The same config, world size and validation as the 150-step race (experiments/optimizer_race/results/cpu_small_budget150:
# cpu_small, np 2 x 1 thread, val every 10 on 8192 tokens), every learning rate picked at
# TUNE_SEED, a seed that is not reported, and the picked rate then run at the REPORT_SEEDS:
#   1. tuned AdamW at each of BUDGETS (experiments/optimizer_race/results/cpu_small_adamw_budget<B>): swept at 0.5x, 1x
#      and 2x the 150-step race's tuned 0.0005, extended past an edge. Every run is its whole
#      budget on its own schedule (warm-up 10, linear cool-down over the last 40% of its steps);
#   2. the 150-step race of every family again, each swept around its tuned rate of that race
#      (experiments/optimizer_race/results/cpu_small_budget150_tune1000; AdamW's 150-step budget point); runs that the
#      race already finished are copied from it (--reuse), not trained again.
#   3. the rates of the groups the race keeps (embedding and head), tuned per family
#      (--embed-head-factors 0.5,2 at each family's picked hidden rate, extended past an edge;
#      experiments/optimizer_race/results/cpu_small_budget150_eh and cpu_small_adamw_budget<B>_eh), the runs of 1 and 2
#      copied where they are the same run;
#   4. the race on the record recipe's architecture (configs/speedrun_cpu_recipe.yaml, head lr
#      0.22 as experiments/optimizer_race/results/speedrun_cpu_recipe_budget150) again, every rate (hidden, then
#      embed/head/scalars) picked on TUNE_SEED (experiments/optimizer_race/results/speedrun_cpu_recipe_budget150_eh), the
#      earlier race's runs copied where they are the same run;
#   5. tuned AdamW on that architecture at each of BUDGETS with its embed/head factor
#      (experiments/optimizer_race/results/speedrun_cpu_recipe_adamw_budget<B>_eh), for its budget-method fit.
# The runs share the machine with other work, so their tables leave times out (--no-times).
# experiments/optimizer_race/race_budget_fit.py turns the results into the speedup table.
#
#   experiments/optimizer_race/race_budgets.sh   # resumable: a finished run (its result in its
#                                                # folder or the grid's runs.jsonl.xz) is skipped
#
# Knobs (environment): BUDGETS ("225 300"), TUNE_SEED (1000), REPORT_SEEDS (1337,1338,1339),
# STAGES ("1 2 3 4 5"), BUILD_DIR (build), OUT (experiments/optimizer_race/results).
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then  # the header above is the usage
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
  exit 0
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
build="${BUILD_DIR:-build}"
out="${OUT:-experiments/optimizer_race/results}"
tune_seed="${TUNE_SEED:-1000}"
stages=" ${STAGES:-1 2 3 4 5} "
budgets="${BUDGETS:-225 300}"
race_on() {
  local config=$1
  shift
  /usr/bin/python3 experiments/optimizer_race/optimizer_race.py --config "$config" --target budget \
    --eval-every 10 --np 2 --extend 4 --lr-factors 0.5,1,2 --tune-seed "$tune_seed" \
    --report-seeds "${REPORT_SEEDS:-1337,1338,1339}" --no-times --engine "$build/apps/engine/engine" "$@"
}
race() { race_on configs/cpu_small.yaml "$@"; }
recipe() { race_on configs/speedrun_cpu_recipe.yaml --set train.val_tokens=8192 --set optim.2.lr=0.22 "$@"; }
if [[ "$stages" == *" 1 "* ]]; then
  for budget in $budgets; do
    echo "== AdamW at $budget steps"
    race --families adamw --steps "$budget" --center adamw=0.0005 --out "$out/cpu_small_adamw_budget$budget"
  done
fi
if [[ "$stages" == *" 2 "* ]]; then
  echo "== every family at 150 steps, tuned on seed $tune_seed"
  race --steps 150 --center adamw=0.0005,muon=0.005,normuon=0.005,soap=0.001,rekls=0.002 \
    --reuse experiments/optimizer_race/results/cpu_small_budget150 --out "$out/cpu_small_budget150_tune$tune_seed"
fi
if [[ "$stages" == *" 3 "* ]]; then
  echo "== every family at 150 steps, embed/head rates tuned per family on seed $tune_seed"
  race --steps 150 --center adamw=0.0005,muon=0.005,normuon=0.005,soap=0.001,rekls=0.001 \
    --embed-head-factors 0.5,2 --reuse "$out/cpu_small_budget150_tune$tune_seed" --out "$out/cpu_small_budget150_eh"
  for budget in $budgets; do
    echo "== AdamW at $budget steps, its embed/head rates tuned"
    race --families adamw --steps "$budget" --center adamw=0.001 --embed-head-factors 0.5,2 \
      --reuse "$out/cpu_small_adamw_budget$budget" --out "$out/cpu_small_adamw_budget${budget}_eh"
  done
fi
if [[ "$stages" == *" 4 "* ]]; then
  echo "== the record recipe's architecture at 150 steps, every rate tuned on seed $tune_seed"
  recipe --steps 150 --center adamw=0.001,muon=0.005,normuon=0.01,soap=0.001,rekls=0.002 \
    --embed-head-factors 0.5,2 --reuse experiments/optimizer_race/results/speedrun_cpu_recipe_budget150 \
    --out "$out/speedrun_cpu_recipe_budget150_eh"
fi
if [[ "$stages" == *" 5 "* ]]; then
  for budget in $budgets; do
    echo "== AdamW on the record recipe's architecture at $budget steps, every rate tuned"
    recipe --families adamw --steps "$budget" --center adamw=0.001 --embed-head-factors 0.5,2 \
      --out "$out/speedrun_cpu_recipe_adamw_budget${budget}_eh"
  done
fi
