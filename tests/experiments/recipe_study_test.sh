#!/usr/bin/env bash
# experiments/recipe_study/recipe_study.sh end to end on a tiny model and tiny shards (its SETS knob): every stage
# with 2 seeds and a few steps, the tune stage on a 2-point head grid (its pick is at an edge, so
# one point past it is added), --plan's counts, the records folder (each run's metrics.jsonl,
# log.txt, config.yaml and result.json; no checkpoints) and its tables (the picks, Welch p values);
# a second call trains nothing, nor does one from a fresh clone (the records, no RUNS_DIR); a study
# with other step counts in the same RUNS_DIR and an under-epoch budget over one epoch are
# refused; a run cut by SIGTERM to the driver resumes from its checkpoint on the next call. The
# plumbing, not the numbers.
#
#   recipe_study_test.sh REPO BUILD_DIR WORK
set -euo pipefail
repo=$1 build=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
python3 "$repo/tests/e2e/make_tiny_data.py" "$work/tiny" >/dev/null
tiny="data.train=$work/tiny/tiny_train_*.bin data.val=$work/tiny/tiny_val_*.bin model.d_model=32"
tiny+=" model.n_head=2 model.seq_len=32 model.vocab_size=256 model.doc_bos=0"
tiny+=" train.batch_tokens=512 train.val_tokens=1024 train.eval_every=2"
study() {  # EXEC=1: exec it (a background call's $! is then the driver itself)
  ${EXEC:+exec} env BUILD_DIR="$build" RUNS_DIR="${RUNS:-$work/runs}" RECORDS_DIR="${RECORDS:-$work/records}" \
    SEEDS="1 2" TUNE_SEED=1000 HEAD_LRS="${HEAD:-0.11 0.22}" EMBED_LRS=0.08 SCALAR_LRS=0.04 \
    STEPS="${STEPS:-6}" UNDER_EPOCH_STEPS="${UNDER:-4}" PROBE_STEPS=4 \
    CHECKPOINT_EVERY="${EVERY:-2}" SETS="$tiny" bash "$repo/experiments/recipe_study/recipe_study.sh" "$@"
}
fail() { echo "FAIL: $*"; exit 1; }

study --plan >"$work/plan.log" || { cat "$work/plan.log"; fail "--plan failed"; }
grep -Eq '^tune +2-3 +0 ' "$work/plan.log" && grep -Eq '^all +26 +0 ' "$work/plan.log" &&
  grep -q '^under_epoch: 4 steps x 512 tokens = 2048 tokens, 64 of one epoch' "$work/plan.log" ||
  { cat "$work/plan.log"; fail "--plan's counts"; }

study >"$work/first.log" 2>&1 || { cat "$work/first.log"; fail "the study failed"; }
n=$(grep -c '^== ' "$work/first.log")
[ "$n" -eq 27 ] || fail "the first call trained $n runs, expected 27 (3 tune + 6 + 2 + 4 + 12)"
[ "$(ls "$work/runs/tune" | grep -vc '\.out$')" -eq 3 ] || fail "tune: $(ls "$work/runs/tune")"
for d in "$work"/runs/*/*/; do
  [ -f "$d/result.json" ] && [ ! -e "$d/checkpoints" ] || fail "$d: no result.json, or its checkpoints kept"
done
python3 - "$repo/experiments" "$work/records/runs.jsonl.xz" <<'PY' || fail "the records' pack"
import sys
sys.path.insert(0, sys.argv[1])
import runpack
held = runpack.read(sys.argv[2])
assert len(held) == 27, "%d runs packed, expected 27" % len(held)
assert all("result" in r and r["metrics"] and r["log"] for r in held.values()), sorted(held)
PY
md="$work/records/tables.md"
for want in '^## 1\. tune' '^The tuned recipe: head 0\.[0-9]*, embed 0\.08, scalar 0\.04\.$' \
  '^\| 3 \| head \(past the edge\) \| (0\.055|0\.44) \| 0\.08 \| 0\.04 \| [0-9.]+ \|' \
  '^- head lr: [0-9.]+ of (0\.055, 0\.11, 0\.22|0\.11, 0\.22, 0\.44) \(final val [0-9.]+\)' \
  '^\| `recipe_tuned` \| the tuned recipe \(head (0\.055|0\.11|0\.22|0\.44), embed 0\.08, scalar 0\.04\) \| 2 \| [0-9.]+ ± [0-9.]+ \| [-+][0-9.]+ \(p = [0-9.e-]+\) \|' \
  '^\| `speedrun_cpu` \| speedrun_cpu to the end \| 2 \| [0-9.]+ ± [0-9.]+ \| - \|' \
  '^\| `recipe_head022_no_ve` \| .* \| 2 \| [0-9.]+ ± [0-9.]+ \| [-+][0-9.]+ \(p = [0-9.e-]+\) \| [-+][0-9.]+ \(p = [0-9.e-]+\) \|' \
  '^## 4\. under one epoch' '^4 steps x 512 tokens = 2048 tokens, 64 of the epoch.s 1249 sequences \(5\.1%\)' \
  '^\| `speedrun_cpu_sigmoid` \| .* \| 2 \| [0-9.]+ ± [0-9.]+ \| [-+][0-9.]+ \(p = [0-9.e-]+\) \| [-+][0-9.]+ \(p = [0-9.e-]+\) \|' \
  '^\| `recipe` \| .* \| 2 \| [0-9.]+ ± [0-9.]+ \| [-+][0-9.]+ \(p = [0-9.e-]+\) \| - \|'; do
  grep -Eq "$want" "$md" || { cat "$md"; fail "tables.md has no line matching: $want"; }
done
# The tuned arms trained at tune's pick, which the tables recompute.
python3 - "$work/records" <<'PY' || exit 1
import glob, json, os, sys
root = sys.argv[1]
picked = json.load(open(os.path.join(root, "tables.json")))["tune"]["picked"]
runs = {}
for line in __import__("lzma").open(os.path.join(root, "runs.jsonl.xz"), "rt"):
    rec = json.loads(line)
    runs[rec["run"]] = rec["result"]
tuned = [n for n in runs if "/recipe_tuned_seed" in n]
assert tuned, sorted(runs)
for n in tuned:
    lrs = runs[n]["lrs"]
    assert all(abs(lrs[c] - picked[c]) < 1e-12 for c in picked), (n, lrs, picked)
under = runs["under_epoch/speedrun_cpu_seed1"]
assert under["epoch_sequences"] == 1249 and abs(under["epoch_fraction"] - 64 / 1249) < 1e-12, under
PY

study >"$work/second.log" 2>&1 || { cat "$work/second.log"; fail "the second call failed"; }
! grep -q '^== ' "$work/second.log" || fail "the second call trained: $(grep '^== ' "$work/second.log")"
# --collect rebuilds the records folder, and the tables script alone regenerates the same tables.
cp "$md" "$work/tables.md"
rm -rf "$work/records"
study --collect >"$work/collect.log" 2>&1 || { cat "$work/collect.log"; fail "--collect failed"; }
cmp -s "$md" "$work/tables.md" || fail "--collect's tables differ: $(diff "$work/tables.md" "$md")"
/usr/bin/python3 "$repo/experiments/recipe_study/recipe_study_tables.py" "$work/records" --quiet
cmp -s "$md" "$work/tables.md" || fail "recipe_study_tables.py's tables differ: $(diff "$work/tables.md" "$md")"
# A fresh clone holds the committed records and no RUNS_DIR: it trains nothing either.
RUNS="$work/fresh" study >"$work/fresh.log" 2>&1 || { cat "$work/fresh.log"; fail "the fresh clone's call failed"; }
! grep -q '^== ' "$work/fresh.log" || fail "the fresh clone's call trained: $(grep '^== ' "$work/fresh.log")"
cmp -s "$md" "$work/tables.md" || fail "the fresh clone's call changed the tables: $(diff "$work/tables.md" "$md")"
rc=0
STEPS=7 study >"$work/other.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q 'holds a study with steps 6, not steps 7' "$work/other.log" ||
  { cat "$work/other.log"; fail "a study with other steps in the same RUNS_DIR was not refused (exit $rc)"; }
rc=0
UNDER=100 RUNS="$work/over" RECORDS="$work/over_records" study >"$work/over.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q 'UNDER_EPOCH_STEPS 100 reads 1600 sequences .* more than the 1249 of one epoch' "$work/over.log" ||
  { cat "$work/over.log"; fail "an under-epoch budget over one epoch was not refused (exit $rc)"; }

# A cut run: SIGTERM to the driver once the run has a checkpoint; the next call resumes it.
cut() { RUNS="$work/cut" RECORDS="$work/cut_records" HEAD=0.22 STEPS=300 EVERY=10 STAGES=tune study; }
(EXEC=1 cut >"$work/cut1.log" 2>&1) &
pid=$!
run="$work/cut/tune/head0.22_embed0.08_scalar0.04_seed1000"
for _ in $(seq 600); do
  compgen -G "$run/checkpoints/step_*/manifest.yaml" >/dev/null && break
  sleep 0.05
done
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 143 ] || { cat "$work/cut1.log"; fail "the cut driver exited $rc, expected 143"; }
[ ! -e "$run/result.json" ] && compgen -G "$run/checkpoints/step_*/manifest.yaml" >/dev/null ||
  { cat "$work/cut1.log"; fail "the cut run has a result.json or no checkpoint"; }
cut >"$work/cut2.log" 2>&1 || { cat "$work/cut2.log"; fail "the resumed study failed"; }
grep -q '^== tune/head0.22_embed0.08_scalar0.04_seed1000 (.*; resumes' "$work/cut2.log" &&
  grep -q 'resumed from' "$run/log.txt" && [ -f "$run/result.json" ] ||
  { cat "$work/cut2.log"; fail "the cut run did not resume from its checkpoint"; }
python3 - "$run/metrics.jsonl" <<'PY' || exit 1
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if l.strip()]
assert steps == sorted(set(steps)) and steps[-1] == 300, "metrics steps after the resume: %s" % steps[-5:]
PY
# A run whose model dies (engine exit 3) is a result: kept as diverged, left out of the picks, and
# the study goes on. A stand-in engine: 4 steps and val loss 4 + the head lr, but exit 3 at step 2
# for head lr 0.44.
mkdir -p "$work/fake/apps/engine"
cat >"$work/fake/apps/engine/engine" <<'SH'
#!/usr/bin/env bash
for a in "$@"; do case "$a" in log.dir=*) dir=${a#log.dir=} ;; optim.2.lr=*) lr=${a#optim.2.lr=} ;; esac; done
[ "${OMPI_COMM_WORLD_RANK:-0}" = 0 ] || { [ "$lr" = 0.44 ] && exit 3; exit 0; }
mkdir -p "$dir"
echo "engine: config x | world size 2 | threads per rank 1 | backend cpu" >"$dir/log.txt"
echo "model: x" >"$dir/config.yaml"
for step in 1 2 3 4; do
  if [ "$lr" = 0.44 ] && [ $step = 3 ]; then echo "step 3: non-finite loss" >>"$dir/log.txt"; exit 3; fi
  val=""; [ $step = 4 ] && val=",\"val_loss\":$(awk -v lr="$lr" 'BEGIN { print 4 + lr }')"
  echo "{\"step\":$step,\"train_loss\":5.0$val}" >>"$dir/metrics.jsonl"
done
SH
chmod +x "$work/fake/apps/engine/engine"
BUILD_DIR="$work/fake" RUNS_DIR="$work/dead" RECORDS_DIR="$work/dead_records" STAGES=tune \
  HEAD_LRS="0.22 0.44" EMBED_LRS=0.08 SCALAR_LRS=0.04 STEPS=4 SETS="$tiny" \
  bash "$repo/experiments/recipe_study/recipe_study.sh" >"$work/dead.log" 2>&1 || { cat "$work/dead.log"; fail "a diverged run stopped the study"; }
grep -q '^   diverged at step 2' "$work/dead.log" &&
  grep -q '^| 2 | head | 0\.44 | 0\.08 | 0\.04 | diverged |' "$work/dead_records/tables.md" &&
  grep -q '^The tuned recipe: head 0\.11, embed 0\.08, scalar 0\.04\.$' "$work/dead_records/tables.md" ||
  { cat "$work/dead.log" "$work/dead_records/tables.md"; fail "the diverged run's record or the pick around it"; }
echo "PASS: 27 runs in 5 stages, their records and tables, the resume, the refusals, a cut run resumed, a diverged run kept"
