#!/usr/bin/env bash
# tables.sh [--no-plot] [DEST]: every table of the optimizer race, regenerated from the committed
# runs (results/<grid>/runs.jsonl.xz), training nothing: each grid's race table
# (optimizer_race.py --table-only with the arguments the grid was raced with), the budget-method
# fits (race_budget_fit.py) and the interleaved step times (race_step_times.py --table-only).
# DEST (default: results/, in place) receives <grid>/race.{md,json,png}, <grid>/step_times.{md,json}
# and the fits' <name>.{md,json}; --no-plot leaves the figures out. tests/experiments runs it into
# a temporary DEST and compares every table with the committed one, byte for byte.
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then  # the header above is the usage
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
  exit 0
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
here=experiments/optimizer_race
results=$here/results
plot=()
if [[ "${1:-}" == --no-plot ]]; then plot=(--no-plot); shift; fi
[[ $# -le 1 ]] || { echo "usage: $0 [--no-plot] [DEST]" >&2; exit 2; }
dest="${1:-$results}"
mkdir -p "$dest"
grid_dest() {  # a grid's folder in DEST, holding its pack (copied when DEST is elsewhere)
  mkdir -p "$dest/$1"
  [[ "$dest/$1" -ef "$results/$1" ]] || cp "$results/$1/runs.jsonl.xz" "$dest/$1/"
  echo "$dest/$1"
}
race() {  # grid config [arguments]: the grid's table, as raced
  local grid=$1 config=$2
  shift 2
  /usr/bin/python3 $here/optimizer_race.py --config "configs/$config.yaml" --table-only --eval-every 10 \
    --np 2 --out "$(grid_dest "$grid")" "${plot[@]}" "$@" >/dev/null
}
# A race read against both targets keeps both tables: race_budget.* and race_adamw.*.
both_targets() {  # grid config [arguments]
  local grid=$1 f
  for target in budget adamw; do
    race "$@" --target $target
    for f in md json png; do
      if [[ -f "$dest/$grid/race.$f" ]]; then mv "$dest/$grid/race.$f" "$dest/$grid/race_$target.$f"; fi
    done
  done
}
# race_budgets.sh's races: every rate picked on seed 1000, reported at 1337-1339.
budgets() {  # grid config [arguments]
  race "$@" --target budget --extend 4 --lr-factors 0.5,1,2 --tune-seed 1000 \
    --report-seeds 1337,1338,1339 --no-times
}

both_targets cpu_small_budget150 cpu_small --extend 4
both_targets speedrun_cpu_recipe_budget150 speedrun_cpu_recipe --steps 150 --extend 3 \
  --center adamw=0.0005,muon=0.005,normuon=0.005,soap=0.001,rekls=0.002
# Issue 65's fourth AdamW budget, where the families land (its _eh grids as they come).
budgets cpu_small_adamw_budget185 cpu_small --families adamw --steps 185 --center adamw=0.0005
for b in 225 300; do
  budgets cpu_small_adamw_budget$b cpu_small --families adamw --steps $b --center adamw=0.0005
  budgets cpu_small_adamw_budget${b}_eh cpu_small --families adamw --steps $b --center adamw=0.001 \
    --embed-head-factors 0.5,2
  budgets speedrun_cpu_recipe_adamw_budget${b}_eh speedrun_cpu_recipe --families adamw --steps $b \
    --center adamw=0.001 --embed-head-factors 0.5,2
done
budgets cpu_small_budget150_tune1000 cpu_small --steps 150 \
  --center adamw=0.0005,muon=0.005,normuon=0.005,soap=0.001,rekls=0.002
budgets cpu_small_budget150_eh cpu_small --steps 150 \
  --center adamw=0.0005,muon=0.005,normuon=0.005,soap=0.001,rekls=0.001 --embed-head-factors 0.5,2
budgets speedrun_cpu_recipe_budget150_eh speedrun_cpu_recipe --steps 150 \
  --center adamw=0.001,muon=0.005,normuon=0.01,soap=0.001,rekls=0.002 --embed-head-factors 0.5,2

fit() {  # name: race_budget_fit.py's arguments follow, folders named under results/
  local name=$1
  shift
  /usr/bin/python3 $here/race_budget_fit.py "$@" --out "$dest/$name" >/dev/null
}
r=$results
fit budget_fit_150_225 --adamw $r/cpu_small_budget150=1337 $r/cpu_small_adamw_budget225 \
  --race $r/cpu_small_budget150
fit budget_fit_150_225_300 --adamw $r/cpu_small_budget150=1337 $r/cpu_small_adamw_budget225 \
  $r/cpu_small_adamw_budget300 --race $r/cpu_small_budget150
fit budget_fit --adamw $r/cpu_small_budget150_tune1000 $r/cpu_small_adamw_budget225 \
  $r/cpu_small_adamw_budget300 --race $r/cpu_small_budget150_tune1000 --race-tune-seed 1000
# Issue 65: the fourth AdamW budget (185 steps, where the families land).
fit budget_fit_150_185_225_300 --adamw $r/cpu_small_budget150_tune1000 $r/cpu_small_adamw_budget185 \
  $r/cpu_small_adamw_budget225 $r/cpu_small_adamw_budget300 --race $r/cpu_small_budget150_tune1000 \
  --race-tune-seed 1000
fit budget_fit_eh --adamw $r/cpu_small_budget150_eh $r/cpu_small_adamw_budget225_eh \
  $r/cpu_small_adamw_budget300_eh --race $r/cpu_small_budget150_eh --race-tune-seed 1000
fit speedrun_cpu_recipe_budget_fit_eh --adamw $r/speedrun_cpu_recipe_budget150_eh \
  $r/speedrun_cpu_recipe_adamw_budget225_eh $r/speedrun_cpu_recipe_adamw_budget300_eh \
  --race $r/speedrun_cpu_recipe_budget150_eh --race-tune-seed 1000

step_times() {  # grid config [arguments]
  local grid=$1 config=$2
  shift 2
  /usr/bin/python3 $here/race_step_times.py --config "configs/$config.yaml" --table-only --rounds 3 \
    --steps 30 --out "$(grid_dest "$grid")" "$@" >/dev/null
}
for grid in step_times_cpu_small step_times_cpu_small_haswell step_times_cpu_small_cooperlake \
  step_times_cpu_small_onednn step_times_cpu_small_vectorised; do
  step_times $grid cpu_small --center adamw=0.0005,muon=0.005,normuon=0.005,soap=0.001,rekls=0.001
done
step_times step_times_speedrun_cpu_recipe speedrun_cpu_recipe --set optim.2.lr=0.22 \
  --center adamw=0.001,muon=0.005,normuon=0.01,soap=0.001,rekls=0.002
