#!/usr/bin/env bash
# experiments/optimizer_race/race_step_times.py end to end on the tiny config: two families, two rounds, the order
# rotated each round; the table, the JSON rows (--json), and the ratios computed from the rounds.
#
#   race_step_times_test.sh REPO BUILD_DIR WORK
set -euo pipefail
repo=$1 build=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
python3 "$repo/tests/e2e/make_tiny_data.py" "$work/data" >/dev/null
/usr/bin/python3 "$repo/experiments/optimizer_race/race_step_times.py" --config "$repo/configs/tiny.yaml" --engine "$build/apps/engine/engine" \
  --families adamw,muon --rounds 2 --steps 6 --np 1 --out "$work/out" --json \
  --set "data.train=$work/data/tiny_train_*.bin" --set "data.val=$work/data/tiny_val_*.bin" >"$work/log"
grep '^step_times: round' "$work/log" | awk '{print $3, $4}' | tr '\n' ' ' | grep -qx '1 adamw 1 muon 2 muon 2 adamw ' ||
  { echo "FAIL: the rounds are not rotated"; cat "$work/log"; exit 1; }
python3 - "$work/out/step_times.json" "$work/log" <<'PY' || exit 1
import json, sys
rows = {r["family"]: r for r in json.load(open(sys.argv[1]))["rows"]}
printed = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
assert [r["family"] for r in printed] == ["adamw", "muon"], printed
a, m = rows["adamw"], rows["muon"]
assert len(a["rounds"]) == 2 and all(t > 0 for t in a["rounds"] + m["rounds"]), rows
assert abs(m["ratio_to_adamw"] - sum(x / y for x, y in zip(m["rounds"], a["rounds"])) / 2) < 1e-12, m
assert abs(a["drift"] - (max(a["rounds"]) / min(a["rounds"]) - 1)) < 1e-12, a
PY
grep -q '^| muon | ' "$work/out/step_times.md" || { echo "FAIL: no muon row"; exit 1; }
if /usr/bin/python3 "$repo/experiments/optimizer_race/race_step_times.py" --families muon --rounds 2 >"$work/bad.log" 2>&1; then
  echo "FAIL: a table without adamw was accepted"; exit 1
fi
echo "PASS: rotated rounds, ratios and drift from the rounds"
# --table-only: the same table from the runs' metrics, training nothing.
cp "$work/out/step_times.md" "$work/first.md"
/usr/bin/python3 "$repo/experiments/optimizer_race/race_step_times.py" --config "$repo/configs/tiny.yaml" --engine /nonexistent \
  --families adamw,muon --rounds 2 --steps 6 --np 1 --out "$work/out" --table-only >/dev/null
cmp -s "$work/first.md" "$work/out/step_times.md" || { echo "FAIL: --table-only changed the table"; exit 1; }
# The same from the pack alone (runs.jsonl.xz: what a race commits).
mkdir "$work/pack" && cp "$work/out/runs.jsonl.xz" "$work/pack/"
/usr/bin/python3 "$repo/experiments/optimizer_race/race_step_times.py" --config "$repo/configs/tiny.yaml" --engine /nonexistent \
  --families adamw,muon --rounds 2 --steps 6 --np 1 --out "$work/pack" --table-only >/dev/null
cmp -s "$work/first.md" "$work/pack/step_times.md" || { echo "FAIL: the pack alone gives another table"; exit 1; }
echo "PASS: --table-only, from the run folders and from the pack alone"
