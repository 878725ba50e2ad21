#!/usr/bin/env bash
# scripts/optimizer_race.py end to end on the tiny config: a two-family race (AdamW, Muon; two
# learning rates each, two seeds of the best), its table, and its resume: with one run's result
# removed, a second call trains that run alone; --table-only trains nothing. The plumbing, not
# the race's conclusions.
#
#   optimizer_race_test.sh REPO BUILD_DIR WORK
set -euo pipefail
repo=$1 build=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
python3 "$repo/tests/e2e/make_tiny_data.py" "$work/data" >/dev/null
race() {
  /usr/bin/python3 "$repo/scripts/optimizer_race.py" --config "$repo/configs/tiny.yaml" \
    --engine "$build/apps/engine/engine" --target 5.3 --steps 8 --eval-every 2 \
    --families adamw,muon --lr-factors 1,2 --seeds 2 --np 2 --out "$work/race" \
    --set "data.train=$work/data/tiny_train_*.bin" --set "data.val=$work/data/tiny_val_*.bin" "$@"
}
race >"$work/first.log"
trained=$(grep -c '^race: ' "$work/first.log")
[ "$trained" -eq 6 ] || { echo "FAIL: the first race trained $trained runs, expected 6"; cat "$work/first.log"; exit 1; }
for family in adamw muon; do
  grep -q "^| $family | " "$work/race/race.md" || { echo "FAIL: no $family row in race.md"; exit 1; }
done
[ -s "$work/race/race.png" ] || { echo "FAIL: no race.png"; exit 1; }
rm "$work/race/muon_lr0.04_seed1234/result.json"
race >"$work/second.log"
[ "$(grep -c '^race: ' "$work/second.log")" -eq 1 ] && grep -q '^race: muon lr 0.04 seed 1234' "$work/second.log" ||
  { echo "FAIL: the resumed race did not train exactly the missing run"; cat "$work/second.log"; exit 1; }
race --table-only >"$work/third.log"
[ "$(grep -c '^race: ' "$work/third.log")" -eq 0 ] || { echo "FAIL: --table-only trained"; exit 1; }
cmp -s <(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rows"])' "$work/race/race.json") \
  <(race --table-only >/dev/null; python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rows"])' "$work/race/race.json") ||
  { echo "FAIL: the table changed without training"; exit 1; }
echo "PASS: 6 runs, one resumed, table rewritten"
sed -n 3,6p "$work/race/race.md"
