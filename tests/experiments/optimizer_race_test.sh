#!/usr/bin/env bash
# experiments/optimizer_race/optimizer_race.py end to end on the tiny config: a two-family race
# (AdamW, Muon; two learning rates each, two seeds of the best), its table, its pack
# (runs.jsonl.xz: every finished run, its metrics thinned) and its resume: with one run removed
# from its folder and the pack, a second call trains that run alone; --table-only trains nothing;
# with every run folder gone (a fresh clone: the pack alone) the table is the same and nothing
# trains. The plumbing, not
# the race's conclusions. Then a budget race (--target budget): the target is set from the tuned runs,
# the steps to it interpolated; --target adamw on the same runs; the sweep's extension past an
# edge; --center with --set on top of the race's groups; and --tune-seed, --report-seeds and
# --reuse (the sweep at a seed that is not reported, a finished run copied from an earlier race);
# --no-times; --embed-head-factors (the kept groups' rates tuned per family).
#
#   optimizer_race_test.sh REPO BUILD_DIR WORK
set -euo pipefail
repo=$1 build=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
python3 "$repo/tests/e2e/make_tiny_data.py" "$work/data" >/dev/null
race() {
  /usr/bin/python3 "$repo/experiments/optimizer_race/optimizer_race.py" --config "$repo/configs/tiny.yaml" \
    --engine "$build/apps/engine/engine" --target 5.3 --steps 8 --eval-every 2 \
    --families adamw,muon --lr-factors 1,2 --extend 0 --seeds 2 --np 2 --out "$work/race" \
    --set "data.train=$work/data/tiny_train_*.bin" --set "data.val=$work/data/tiny_val_*.bin" "$@"
}
race >"$work/first.log"
runs() { grep '^race: ' "$1" | grep -vc 'state probe' || true; }
trained=$(runs "$work/first.log")
[ "$trained" -eq 6 ] || { echo "FAIL: the first race trained $trained runs, expected 6"; cat "$work/first.log"; exit 1; }
[ "$(grep -c 'state probe' "$work/first.log")" -eq 2 ] || { echo "FAIL: expected one state probe per family"; exit 1; }
# The optimizer state is measured from checkpoints: AdamW keeps two moments of the hidden
# matrices where Muon keeps one momentum, the other groups being the same AdamW.
python3 - "$work/race/race.json" <<'PY' || exit 1
import json, sys
rows = {r["family"]: r for r in json.load(open(sys.argv[1]))["rows"]}
assert rows["adamw"]["state_mib"] > rows["muon"]["state_mib"] > 0, rows
PY
for family in adamw muon; do
  grep -q "^| $family | " "$work/race/race.md" || { echo "FAIL: no $family row in race.md"; exit 1; }
done
[ -s "$work/race/race.png" ] || { echo "FAIL: no race.png"; exit 1; }
python3 - "$repo/experiments" "$work/race/runs.jsonl.xz" <<'PY' || exit 1
import sys
sys.path.insert(0, sys.argv[1])
import runpack
held = runpack.read(sys.argv[2])
assert len(held) == 8 and all("result" in r and "log" in r for r in held.values()), sorted(held)
rows = held["muon_lr0.04_seed1234"]["metrics"]
assert rows and all(set(r) <= {"step", "train_loss", "val_loss", "lr", "elapsed_ms", "step_ms", "tokens_per_s",
                               "peak_mem_bytes"} for r in rows), rows[:2]
del held["muon_lr0.04_seed1234"]
runpack.write(sys.argv[2], list(held.values()))
PY
rm -r "$work/race/muon_lr0.04_seed1234"
race >"$work/second.log"
[ "$(runs "$work/second.log")" -eq 1 ] && grep -q '^race: muon lr 0.04 seed 1234$' "$work/second.log" ||
  { echo "FAIL: the resumed race did not train exactly the missing run"; cat "$work/second.log"; exit 1; }
race --table-only >"$work/third.log"
[ "$(grep -c '^race: ' "$work/third.log")" -eq 0 ] || { echo "FAIL: --table-only trained"; exit 1; }
cmp -s <(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rows"])' "$work/race/race.json") \
  <(race --table-only >/dev/null; python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rows"])' "$work/race/race.json") ||
  { echo "FAIL: the table changed without training"; exit 1; }
cp "$work/race/race.md" "$work/race_before.md"
mkdir "$work/fresh" && cp "$work/race/runs.jsonl.xz" "$work/fresh/"
race --out "$work/fresh" --table-only >/dev/null
cmp -s "$work/race_before.md" "$work/fresh/race.md" || { echo "FAIL: the pack alone gives another table"; diff "$work/race_before.md" "$work/fresh/race.md"; exit 1; }
race --out "$work/fresh" >"$work/fresh.log"
[ "$(grep -c '^race: ' "$work/fresh.log")" -eq 0 ] || { echo "FAIL: the race trained again from its pack"; cat "$work/fresh.log"; exit 1; }
echo "PASS: 6 runs, one resumed, table rewritten, the same table and no training from the pack alone"
sed -n 3,6p "$work/race/race.md"
# --target budget: every run trains all steps; the target is the highest final val loss among the
# tuned runs, so every tuned seed reaches it and the worst one does so at its last validation.
race --target budget --lr-factors 1 --out "$work/budget" >"$work/budget.log"
[ "$(runs "$work/budget.log")" -eq 4 ] || { echo "FAIL: the budget race trained other than 4 runs"; cat "$work/budget.log"; exit 1; }
python3 - "$work/budget/race.json" "$repo/experiments" <<'PY' || exit 1
import json, os, sys
sys.path.insert(0, sys.argv[2])
import runpack
race = json.load(open(sys.argv[1]))
tuned = [s for r in race["results"].values() for s in r["seeds"]]
assert all("val_curve" not in s for s in tuned), "race.json repeats the curves the pack holds"
pack = runpack.read(os.path.join(os.path.dirname(sys.argv[1]), runpack.FILE))
for s in tuned:  # each run's curve from the pack
    name = "%s_lr%g%s_seed%d" % (s["family"], s["lr"], "" if s.get("eh", 1.0) == 1.0 else "_eh%g" % s["eh"], s["seed"])
    s["val_curve"] = pack[name]["result"]["val_curve"]
assert all(len(s["val_curve"]) and s["val_curve"][-1][0] == 8 for s in tuned), "a budget run stopped early"
assert race["target"] == max(s["final_val_loss"] for s in tuned), "target is not the worst tuned final loss"
assert all(s["target_step"] is not None for s in tuned), "a tuned run does not reach the budget target"
worst = max(tuned, key=lambda s: s["final_val_loss"])
assert worst["target_step"] == 8, "the worst tuned run reaches the target before its last validation"
# Steps to the target are interpolated between the validation that reaches it and the one before.
for s in tuned:
    i = next(i for i, c in enumerate(s["val_curve"]) if c[2] <= race["target"])
    low = s["val_curve"][i - 1][0] if i > 0 else s["val_curve"][i][0]
    assert low <= s["target_step"] <= s["val_curve"][i][0], "steps to target %g outside (%g, %g]" % (
        s["target_step"], low, s["val_curve"][i][0])
print("PASS: budget race, target %.4f" % race["target"])
PY
# --target adamw: the same runs, the target tuned AdamW's worst final loss (no training).
race --target adamw --lr-factors 1 --out "$work/budget" --table-only >"$work/adamw.log"
[ "$(grep -c '^race: ' "$work/adamw.log")" -eq 0 ] || { echo "FAIL: --target adamw --table-only trained"; exit 1; }
python3 - "$work/budget/race.json" <<'PY' || exit 1
import json, sys
race = json.load(open(sys.argv[1]))
adamw = race["results"]["adamw"]["seeds"]
assert race["target"] == max(s["final_val_loss"] for s in adamw), "target is not tuned AdamW's worst final loss"
assert all(s["target_step"] is not None for s in adamw), "an AdamW seed does not reach its own target"
print("PASS: --target adamw, target %.4f" % race["target"])
PY
# --extend: a best learning rate at an edge of a two-point sweep is followed past that edge once.
race --families adamw --seeds 1 --extend 1 --out "$work/extend" >"$work/extend.log"
python3 - "$work/extend/race.json" <<'PY' || exit 1
import json, sys
sweep = json.load(open(sys.argv[1]))["results"]["adamw"]["sweep"]
assert len(sweep) == 3, "expected the two swept lrs and one past the edge, got %d runs" % len(sweep)
rank = lambda s: (s["target_step"] is None, s["target_step"] or 0, s["val_loss_at_target"] or 0, s["final_val_loss"])
low, high = sorted(sweep[:2], key=lambda s: s["lr"])
want = low["lr"] / 2 if rank(low) <= rank(high) else high["lr"] * 2
assert abs(sweep[2]["lr"] - want) < 1e-12, "the extra lr is %g, expected %g" % (sweep[2]["lr"], want)
print("PASS: the sweep went on past its best edge to lr %g" % want)
PY
# --center: a family's sweep is centred on the lr it names (a retuned race starts from an earlier
# race's best), and --set applies on top of the race's groups (a kept group's lr can be retuned).
race --families adamw --lr-factors 1 --seeds 1 --extend 0 --center adamw=0.005 --set optim.1.lr=0.0123 \
  --out "$work/center" >"$work/center.log"
[ -s "$work/center/adamw_lr0.005_seed1234/result.json" ] ||
  { echo "FAIL: --center adamw=0.005 did not train adamw at lr 0.005"; cat "$work/center.log"; exit 1; }
grep -A3 '^optim:' "$work/center/adamw_lr0.005_seed1234/log.txt" | sed -n 3p | grep -q 'lr: 0.0123' ||
  { echo "FAIL: --set optim.1.lr did not reach the run's group 1"; grep -A3 '^optim:' "$work/center/adamw_lr0.005_seed1234/log.txt"; exit 1; }
if race --center adamw:0.005 --table-only >"$work/bad.log" 2>&1; then
  echo "FAIL: --center adamw:0.005 was accepted"; exit 1
fi
grep -q "adamw:0.005" "$work/bad.log" || { echo "FAIL: the --center error does not name the item"; cat "$work/bad.log"; exit 1; }
echo "PASS: --center and --set on top of the race's groups"
# --tune-seed with --report-seeds: the sweep runs at a seed that is not reported; --reuse copies a
# run that an earlier race finished (here the --center run, seed 1234) instead of training it.
race --families adamw --lr-factors 1 --extend 0 --center adamw=0.005 --tune-seed 1234 --report-seeds 1235,1236 \
  --reuse "$work/center" --out "$work/reuse" >"$work/reuse.log"
grep -q '^race: adamw lr 0.005 seed 1234 (reused from ' "$work/reuse.log" &&
  [ "$(grep '^race: ' "$work/reuse.log" | grep -v 'state probe' | grep -vc reused)" -eq 2 ] ||
  { echo "FAIL: expected seed 1234 reused and seeds 1235, 1236 trained"; cat "$work/reuse.log"; exit 1; }
cmp -s "$work/center/adamw_lr0.005_seed1234/result.json" "$work/reuse/adamw_lr0.005_seed1234/result.json" ||
  { echo "FAIL: the reused run's result.json is not the earlier race's"; exit 1; }
# --reuse of a race held only in its pack (a committed race on a fresh clone).
mkdir "$work/center_pack" && cp "$work/center/runs.jsonl.xz" "$work/center_pack/"
race --families adamw --lr-factors 1 --extend 0 --center adamw=0.005 --tune-seed 1234 --report-seeds 1235 \
  --reuse "$work/center_pack" --out "$work/reuse_pack" >"$work/reuse_pack.log"
grep -q '^race: adamw lr 0.005 seed 1234 (reused from ' "$work/reuse_pack.log" &&
  python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1])) != json.load(open(sys.argv[2])))' \
    "$work/center/adamw_lr0.005_seed1234/result.json" "$work/reuse_pack/adamw_lr0.005_seed1234/result.json" ||
  { echo "FAIL: a run held only in a pack was not reused"; cat "$work/reuse_pack.log"; exit 1; }
python3 - "$work/reuse/race.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))["results"]["adamw"]
assert [s["seed"] for s in r["sweep"]] == [1234], r["sweep"]
assert [s["seed"] for s in r["seeds"]] == [1235, 1236], "reported seeds %s" % [s["seed"] for s in r["seeds"]]
PY
echo "PASS: --tune-seed, --report-seeds and --reuse"
# --no-times: the table and the plot leave out times and tokens/s, the steps stay.
race --families adamw --lr-factors 1 --extend 0 --center adamw=0.005 --tune-seed 1234 --report-seeds 1235,1236 \
  --out "$work/reuse" --table-only --no-times >"$work/notimes.log"
head -1 "$work/reuse/race.md" | grep -q 'times left out' && ! grep -q 'tok/s\|seconds to target' "$work/reuse/race.md" &&
  grep -q '^| adamw | 0.005 (' "$work/reuse/race.md" ||
  { echo "FAIL: --no-times left times in the table"; cat "$work/reuse/race.md"; exit 1; }
echo "PASS: --no-times"
# --embed-head-factors: at the best hidden lr and the tuning seed, the kept groups' rates times
# each factor (after --set), named _eh<f>; the reported seeds run the best pair.
race --families adamw --lr-factors 1 --extend 0 --seeds 1 --center adamw=0.005 --set optim.1.lr=0.0123 \
  --embed-head-factors 2 --out "$work/eh" >"$work/eh.log"
grep -q '^race: adamw lr 0.005 embed/head x2 seed 1234$' "$work/eh.log" ||
  { echo "FAIL: no embed/head x2 run"; cat "$work/eh.log"; exit 1; }
python3 - "$work/eh" <<'PY' || exit 1
import json, os, sys
out = sys.argv[1]
def first_group_lr(run):
    for line in open(os.path.join(out, run, "metrics.jsonl")):
        row = json.loads(line)
        if "group_lr" in row:
            return row["group_lr"]
base, doubled = first_group_lr("adamw_lr0.005_seed1234"), first_group_lr("adamw_lr0.005_eh2_seed1234")
assert doubled[0] == base[0], "the hidden group's lr moved: %s %s" % (base, doubled)
assert all(abs(d - 2 * b) <= 1e-12 * abs(b) for b, d in zip(base[1:], doubled[1:])), (base, doubled)
r = json.load(open(os.path.join(out, "race.json")))["results"]["adamw"]
assert sorted(s["eh"] for s in r["sweep"]) == [1.0, 2.0], r["sweep"]
best = min(r["sweep"], key=lambda s: s["final_val_loss"])
assert r["best_eh"] == best["eh"] and all(s["eh"] == best["eh"] for s in r["seeds"]), r
PY
grep -A3 '^optim:' "$work/eh/adamw_lr0.005_eh2_seed1234/log.txt" | sed -n 3p | grep -q 'lr: 0.0246' ||
  { echo "FAIL: the factor did not apply on top of --set optim.1.lr"; grep -A3 '^optim:' "$work/eh/adamw_lr0.005_eh2_seed1234/log.txt"; exit 1; }
if race --embed-head-factors 2,x --table-only >"$work/bad_eh.log" 2>&1; then
  echo "FAIL: --embed-head-factors 2,x was accepted"; exit 1
fi
echo "PASS: --embed-head-factors"
