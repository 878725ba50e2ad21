#!/usr/bin/env bash
# experiments/forgetting/forgetting.sh end to end on a tiny model (its SETS knob) and tiny shards (DATA_DIR): the
# control grid, fine-tuning on the pretraining split itself (FT_SPLIT=brown_informative), one
# AdamW and one OSFT run. runs.tsv heads both loss columns by the split and holds equal losses in
# them, each run's metrics.jsonl and log.txt stay in OUT and its checkpoints go, the frontier
# reports the control; a second call runs nothing (--count: none left), a call with other step
# counts into the same OUT is refused, and forgetting_frontier.py reads an older runs.tsv's
# informative / imaginative header as the Brown splits and tabulates a grid still running (a ratio
# missing on one seed). With PRETRAIN_PER_SEED=1 each seed pretrains its own model and its runs
# are measured from it; with the checkpoints gone (a fresh clone) a pretraining that comes back
# with other bits moves its seed's runs aside and trains them again; forgetting_all.sh's code grid
# on a fresh clone goes on from its docs. The plumbing, not the numbers.
#
#   forgetting_test.sh REPO BUILD_DIR WORK
set -euo pipefail
repo=$1 build=$2 work=$3
rm -rf "$work" && mkdir -p "$work/data/brown_informative"
python3 "$repo/tests/e2e/make_tiny_data.py" "$work/tiny" >/dev/null
for part in train val; do
  ln -s "$work/tiny/tiny_${part}_000000.bin" "$work/data/brown_informative/brown_informative_${part}_000000.bin"
done
grid() {
  BUILD_DIR="$build" DATA_DIR="$work/data" OUT="$work/control" PRETRAIN_DIR="$work/pretrain" \
    FT_SPLIT=brown_informative PRETRAIN_STEPS=4 FT_STEPS="${FT_STEPS:-2}" SEEDS=1 ADAMW_LRS=1e-3 OSFT_URRS=0.5 \
    OSFT_LRS=1e-3 SETS="model.n_layer=2 model.n_head=2 model.d_model=64 model.seq_len=32 model.vocab_size=256 train.batch_tokens=512 train.val_tokens=4096" \
    bash "$repo/experiments/forgetting/forgetting.sh" "$@"
}
fail() { echo "FAIL: $*"; exit 1; }
[ "$(grid --count)" = "2 2" ] || fail "--count before the grid: '$(grid --count)', expected '2 2'"
grid >"$work/first.log" 2>&1 || { cat "$work/first.log"; fail "the grid failed"; }
runs="$work/control/runs.tsv"
[ "$(head -n1 "$runs")" = "$(printf 'run\tmethod\turr\tlr\tseed\tbrown_informative\tbrown_informative\tseconds')" ] ||
  fail "runs.tsv header: $(head -n1 "$runs")"
[ "$(tail -n +2 "$runs" | cut -f1 | tr '\n' ' ')" = "pretrained adamw_lr1e-3_seed1 osft_urr0.5_lr1e-3_seed1 " ] ||
  fail "runs.tsv rows: $(cat "$runs")"
awk -F'\t' 'NR > 1 && ($6 != $7 || $6 !~ /^[0-9.]+$/) { exit 1 }' "$runs" ||
  fail "the control's two loss columns differ or are not losses: $(cat "$runs")"
for run in adamw_lr1e-3_seed1 osft_urr0.5_lr1e-3_seed1; do
  [ -s "$work/control/$run/metrics.jsonl" ] && [ -s "$work/control/$run/log.txt" ] || fail "$run: no metrics.jsonl or log.txt in OUT"
  [ ! -e "$work/control/$run/checkpoints" ] || fail "$run: its checkpoints were kept"
done
grep -q 'the pretraining split itself (the control)' "$work/control/frontier.md" || fail "frontier.md does not report the control"
python3 - "$work/control/frontier.json" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
assert d["control"] and d["splits"] == {"pretraining": "brown_informative", "finetuning": "brown_informative"}, d["splits"]
assert d["comparisons"] == {} and len(d["runs"]) == 2, d["comparisons"]
assert all(abs(r["gain"] + r["forgetting"]) < 1e-9 for r in d["runs"]), "control gain is not minus forgetting"
PY
[ "$(grid --count)" = "2 0" ] || fail "--count after the grid: '$(grid --count)', expected '2 0'"
grid >"$work/second.log" 2>&1 || { cat "$work/second.log"; fail "the second call failed"; }
! grep -q '^== ' "$work/second.log" || fail "the second call trained: $(grep '^== ' "$work/second.log")"
rc=0
FT_STEPS=3 grid >"$work/other.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "holds the grid 'FT_SPLIT=brown_informative FREEZE= PRETRAIN_STEPS=4 FT_STEPS=2'" "$work/other.log" ||
  { cat "$work/other.log"; fail "a rerun with other step counts into the same OUT was not refused (exit $rc)"; }
# An issue 38 runs.tsv: informative / imaginative columns.
mkdir -p "$work/legacy"
printf 'run\tmethod\turr\tlr\tseed\tinformative\timaginative\tseconds\n' >"$work/legacy/runs.tsv"
printf 'pretrained\tpretrained\t-\t-\t-\t6.0\t5.0\t0\nadamw_lr1e-3_seed1\tadamw\t-\t1e-3\t1\t6.5\t4.0\t9\n' >>"$work/legacy/runs.tsv"
/usr/bin/python3 "$repo/experiments/forgetting/forgetting_frontier.py" "$work/legacy" >/dev/null
grep -q '| adamw | 0.001 | 1 | 1.0000 ± 0.0000 | 0.5000 ± 0.0000 |' "$work/legacy/frontier.md" &&
  grep -q 'gain (−Δ brown_imaginative val) | forgetting (Δ brown_informative val)' "$work/legacy/frontier.md" ||
  { cat "$work/legacy/frontier.md"; fail "the legacy runs.tsv was not read as brown_informative / brown_imaginative"; }
# A grid still running: seed 2 has no run of one OSFT ratio yet. That ratio's comparison uses the
# seeds that have it (it raised an IndexError before).
mkdir -p "$work/partial"
{
  printf 'run\tmethod\turr\tlr\tseed\tinformative\timaginative\tseconds\n'
  printf 'pretrained\tpretrained\t-\t-\t-\t6.0\t5.0\t0\n'
  for seed in 1 2; do
    printf 'adamw_lr1e-3_seed%s\tadamw\t-\t1e-3\t%s\t6.2\t4.6\t9\n' $seed $seed
    printf 'adamw_lr3e-3_seed%s\tadamw\t-\t3e-3\t%s\t6.5\t4.2\t9\n' $seed $seed
    printf 'osft_urr0.5_lr1e-3_seed%s\tosft\t0.5\t1e-3\t%s\t6.1\t4.7\t9\n' $seed $seed
    printf 'osft_urr0.5_lr3e-3_seed%s\tosft\t0.5\t3e-3\t%s\t6.3\t4.4\t9\n' $seed $seed
  done
  printf 'osft_urr0.25_lr1e-3_seed1\tosft\t0.25\t1e-3\t1\t6.05\t4.8\t9\n'
  printf 'osft_urr0.25_lr3e-3_seed1\tosft\t0.25\t3e-3\t1\t6.2\t4.5\t9\n'
} >"$work/partial/runs.tsv"
/usr/bin/python3 "$repo/experiments/forgetting/forgetting_frontier.py" "$work/partial" >/dev/null ||
  fail "a grid with a ratio missing on one seed was not tabulated"
/usr/bin/python3 - "$work/partial/frontier.json" <<'PY' || fail "the partial grid's comparisons use the wrong seeds"
import json, sys
c = json.load(open(sys.argv[1]))["comparisons"]
assert c["osft urr 0.25"]["seeds"] == [1], c["osft urr 0.25"]
assert c["osft urr 0.5"]["seeds"] == [1, 2], c["osft urr 0.5"]
assert all("p_paired" in v for v in c["osft urr 0.5"]["levels"]), c["osft urr 0.5"]
PY
# The paired t-test's p: differences 0.010, 0.012, 0.008 (mean 0.01, sd 0.002, t = 8.66, 2 degrees
# of freedom) give p = 0.01307 by hand; a single seed gives none.
/usr/bin/python3 - "$repo/experiments/forgetting" <<'PY' || fail "the paired t-test's p is wrong"
import sys
sys.path.insert(0, sys.argv[1])
from forgetting_frontier import paired_p
assert abs(paired_p([0.010, 0.012, 0.008]) - 0.013072) < 1e-5, paired_p([0.010, 0.012, 0.008])
assert paired_p([0.01]) is None
PY
# PRETRAIN_PER_SEED=1: each seed fine-tunes from its own pretraining (train.seed = the seed).
seeded() {
  BUILD_DIR="$build" DATA_DIR="$work/data" OUT="$work/seeded" PRETRAIN_DIR="$work/pretrain" \
    PRETRAIN_PER_SEED=1 FT_SPLIT=brown_informative PRETRAIN_STEPS=4 FT_STEPS=2 SEEDS="1 2" ADAMW_LRS=1e-3 \
    OSFT_URRS=0.5 OSFT_LRS=1e-3 SETS="model.n_layer=2 model.n_head=2 model.d_model=64 model.seq_len=32 model.vocab_size=256 train.batch_tokens=512 train.val_tokens=4096" \
    bash "$repo/experiments/forgetting/forgetting.sh" "$@"
}
seeded >"$work/seeded.log" 2>&1 || { cat "$work/seeded.log"; fail "the per-seed grid failed"; }
sruns="$work/seeded/runs.tsv"
[ "$(tail -n +2 "$sruns" | cut -f1,5 | tr '\t\n' ': ')" = "pretrained_seed1:1 adamw_lr1e-3_seed1:1 osft_urr0.5_lr1e-3_seed1:1 pretrained_seed2:2 adamw_lr1e-3_seed2:2 osft_urr0.5_lr1e-3_seed2:2 " ] ||
  fail "per-seed runs.tsv rows: $(cat "$sruns")"
for seed in 1 2; do
  grep -q "train.seed=$seed" "$work/pretrain_seed$seed/log.txt" 2>/dev/null ||
    grep -q "seed: $seed$" "$work/pretrain_seed$seed/log.txt" || fail "pretrain_seed$seed did not train at seed $seed"
  [ -s "$work/seeded/pretrained_seed$seed.sha256" ] || fail "no pretrained_seed$seed.sha256"
done
[ "$(cat "$work/seeded/pretrained_seed1.sha256")" != "$(cat "$work/seeded/pretrained_seed2.sha256")" ] ||
  fail "the two seeds' pretrainings are one model"
grep -q ', each seed from its own cpu_small pretrained 4 steps on it' "$work/seeded/frontier.md" ||
  { cat "$work/seeded/frontier.md"; fail "frontier.md does not say each seed has its own pretraining"; }
/usr/bin/python3 - "$work/seeded/frontier.json" "$sruns" <<'PY' || fail "per-seed runs are not measured from their own seed's pretraining"
import json, sys
d = json.load(open(sys.argv[1]))
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[2])][1:]
base = {r[4]: float(r[5]) for r in rows if r[1] == "pretrained"}
for r in d["runs"]:
    assert abs(r["forgetting"] - (r["loss_pretraining_split"] - base[str(r["seed"])])) < 1e-9, r
assert sorted(d["pretrained_per_seed"]) == ["1", "2"], d["pretrained_per_seed"]
PY
# A session cut both seeds short (their OSFT rows are not in yet) and the fresh clone that goes on
# holds runs.tsv but no checkpoint. On the same machine seed 1's pretraining comes back bit for
# bit and its AdamW run stands; seed 2's, standing in for another CPU's bits, does not match its
# recorded sha256, and both its runs move aside and train again.
grep -v '^osft' "$sruns" >"$sruns.cut" && mv "$sruns.cut" "$sruns" && rm -rf "$work/seeded"/osft_*
seed1_adamw="$(grep '^adamw_lr1e-3_seed1	' "$sruns")"
rm -rf "$work/pretrain_seed1" "$work/pretrain_seed2"
echo 0000 >"$work/seeded/pretrained_seed2.sha256"
seeded >"$work/seeded2.log" 2>&1 || { cat "$work/seeded2.log"; fail "the per-seed grid's second call failed"; }
grep -q "seed 2's pretraining is not the model its runs" "$work/seeded2.log" || fail "seed 2's stale runs were not named"
! grep -q "seed 1's pretraining is not" "$work/seeded2.log" || fail "seed 1's pretraining did not come back bit for bit"
[ "$(grep '^== [ao]' "$work/seeded2.log" | cut -d: -f1 | tr '\n' ' ')" = "== osft_urr0.5_lr1e-3_seed1 == adamw_lr1e-3_seed2 == osft_urr0.5_lr1e-3_seed2 " ] ||
  fail "not the cut runs and seed 2's trained again: $(grep '^== ' "$work/seeded2.log")"
[ "$(grep '^adamw_lr1e-3_seed1	' "$sruns")" = "$seed1_adamw" ] || fail "seed 1's AdamW row changed"
[ "$(tail -n +2 "$sruns" | wc -l)" = 6 ] || fail "runs.tsv after the stale seed: $(cat "$sruns")"
stale=$(ls -d "$work/seeded"/stale_seed2_*)
[ "$(tail -n +2 "$stale/runs.tsv" | cut -f1 | tr '\n' ' ')" = "pretrained_seed2 adamw_lr1e-3_seed2 " ] &&
  [ -d "$stale/adamw_lr1e-3_seed2" ] || fail "the stale seed's rows and folders were not kept aside"
# forgetting_all.sh's code grid into a docs folder, then again from a fresh clone (its OUTs and
# pretrainings gone, the docs kept): it restores the grid from the docs and trains nothing.
mkdir -p "$work/data/code"
for part in train val; do
  ln -s "$work/tiny/tiny_${part}_000000.bin" "$work/data/code/code_${part}_000000.bin"
done
all() {
  BUILD_DIR="$build" DATA_DIR="$work/data" RUNS_DIR="$work/all_runs" DOCS_DIR="$work/all_docs" \
    PRETRAIN_DIR="$work/all_runs/pretrain" GRIDS=code PRETRAIN_STEPS=4 FT_STEPS=2 SEEDS=1 \
    ADAMW_LRS=1e-3 OSFT_LRS=1e-3 SETS="model.n_layer=2 model.n_head=2 model.d_model=64 model.seq_len=32 model.vocab_size=256 train.batch_tokens=512 train.val_tokens=4096" \
    bash "$repo/experiments/forgetting/forgetting_all.sh" "$@"
}
all >"$work/all.log" 2>&1 || { cat "$work/all.log"; fail "forgetting_all.sh's code grid failed"; }
for f in runs.tsv grid frontier.md pretrained_seed1.sha256 runs.jsonl.xz; do
  [ -s "$work/all_docs/code/$f" ] || fail "forgetting_all.sh did not copy code/$f to its docs"
done
packed() { /usr/bin/python3 "$repo/experiments/runpack.py" list "$work/all_docs/code/runs.jsonl.xz" | tr '\n' ' '; }
[ "$(packed)" = "adamw_lr1e-3_seed1 osft_urr0.5_lr1e-3_seed1 pretrain_seed1 " ] ||
  fail "the code grid's pack holds: $(packed)"
/usr/bin/python3 - "$repo/experiments" "$work/all_docs/code/runs.jsonl.xz" <<'PY' || fail "the pack's runs lack their logs or metrics"
import sys
sys.path.insert(0, sys.argv[1])
import runpack
for name, rec in runpack.read(sys.argv[2]).items():
    assert rec["log"].strip() and rec["metrics"], name
    assert all(set(r) <= {"step", "train_loss", "val_loss", "lr", "grad_norm", "elapsed_ms"} for r in rec["metrics"]), name
PY
rm -rf "$work/all_runs"
all --plan >"$work/plan.log" 2>&1 || { cat "$work/plan.log"; fail "forgetting_all.sh --plan failed"; }
grep -Eq '^code +2 +0$' "$work/plan.log" && ! grep -q 'pretraining' "$work/plan.log" ||
  fail "a fresh clone's --plan does not count the committed runs: $(cat "$work/plan.log")"
rm -rf "$work/all_runs"
all >"$work/all2.log" 2>&1 || { cat "$work/all2.log"; fail "forgetting_all.sh from a fresh clone failed"; }
grep -q 'code: 2 finished runs restored' "$work/all2.log" || fail "the code grid was not restored: $(cat "$work/all2.log")"
! grep -q '^== ' "$work/all2.log" || fail "the fresh clone trained: $(grep '^== ' "$work/all2.log")"
[ "$(packed)" = "adamw_lr1e-3_seed1 osft_urr0.5_lr1e-3_seed1 pretrain_seed1 " ] ||
  fail "the fresh clone's collect lost runs from the pack: $(packed)"
echo "PASS: the control grid (2 runs), its resume, the refused rerun, a legacy runs.tsv, a partial grid, the paired p, a grid with a pretraining per seed and its stale seed, forgetting_all.sh from a fresh clone (its --plan too)"
