#!/usr/bin/env bash
# forgetting.sh: OSFT's claim, measured (issue 38; docs/specs/osft.md section 11). Does OSFT
# forget less of a first task than full fine-tuning, at equal gain on a second one?
#   1. pretrains the default CPU model (configs/cpu_small.yaml) on the informative-prose Brown
#      split (data/brown_informative, scripts/prepare_data.sh) for PRETRAIN_STEPS steps, once;
#   2. fine-tunes it on the split FT_SPLIT for FT_STEPS steps (train.init_from): full
#      fine-tuning with AdamW on every weight (configs/osft_finetune_baseline.yaml) at each
#      learning rate of ADAMW_LRS, and OSFT (configs/osft_finetune.yaml: OSFT on the hidden
#      matrices, AdamW on embeddings and head, both at the run's learning rate) at each
#      unfreeze_rank_ratio of OSFT_URRS and learning rate of OSFT_LRS; each once per seed of SEEDS
#      (the seed draws the fine-tuning data order: data.shuffle on);
#   3. evaluates every checkpoint on both splits' whole validation sets (engine eval --all) and
#      writes OUT/frontier.{md,json,png} (experiments/forgetting/forgetting_frontier.py): each run a point, gain on
#      the new split against forgetting of the old, each method's frontier, and the methods
#      compared at equal gain along their frontiers, seed by seed.
# FT_SPLIT (issue 50): brown_imaginative (the default: imaginative prose), code (eslint's
# JavaScript source, scripts/prepare_code_data.sh: another domain), or brown_informative, the
# pretraining split itself: the control, whose forgetting is what re-warming the lr after an
# annealed pretraining costs alone (its gain is minus its forgetting).
# OUT/runs.tsv: one row per run, its two loss columns headed by the splits' names (pretraining
# split, then fine-tuning split; older files headed informative / imaginative are read as
# brown_informative / brown_imaginative). Each run's log.dir is OUT/<run> (metrics.jsonl,
# log.txt; the checkpoints are deleted once evaluated), its output OUT/<run>.log.
# A fine-tuning run is never stopped by the divergence guard (train.diverge_loss_factor=0): a
# rate too high for the grid is a point far off the frontier, not a failed grid (a non-finite loss
# still stops it). Resumable: the pretraining resumes from its newest checkpoint, and a grid run whose row is in
# OUT/runs.tsv is not run again (a stopped run resumes from its own checkpoint); run the same
# command again to go on. OUT/grid records FT_SPLIT, FREEZE and the step counts, and a rerun with
# others into the same OUT is refused. --count prints the grid's size and its runs left, and
# stops. Knobs (environment): FT_SPLIT (brown_imaginative),
# PRETRAIN_STEPS (2000), FT_STEPS (100), SEEDS ("1 2"), ADAMW_LRS ("3e-4 1e-3 3e-3 1e-2"),
# OSFT_URRS ("0.5 0.25"), OSFT_LRS ("1e-3 3e-3 1e-2"), NP (2 ranks, OMP_NUM_THREADS 1 each),
# BUILD_DIR (build), OUT (runs/frontier_<FT_SPLIT>, with _frozen appended under FREEZE),
# PRETRAIN_DIR (runs/frontier/pretrain: every grid shares one pretraining), PRETRAIN_PER_SEED
# (0; 1: each seed fine-tunes from its own pretraining at train.seed = the seed, in
# PRETRAIN_DIR_seed<seed>, its losses the row pretrained_seed<seed>: a seed's runs and its
# pretraining fit in one sitting on a machine that keeps nothing between sittings), DATA_DIR (data: the
# folder of the split folders), SETS (KEY=VALUE overrides, space-separated, for every training run
# after the script's own, e.g. a smaller model: tests/e2e/forgetting_test.sh),
# FREEZE ("embed_head": both arms hold the embedding and the head at lr 0, so the comparison is
# about the hidden matrices OSFT constrains; issue 50. Each arm's groups are then: the hidden
# matrices (AdamW, or OSFT), embed.weight and lm_head.weight (AdamW at lr 0: no update), and any
# other weight at the run's lr). experiments/forgetting/forgetting_frozen.sh runs that grid;
# experiments/forgetting/forgetting_all.sh runs every grid of issue 50.
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then  # the header above is the usage
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
  exit 0
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
build="${BUILD_DIR:-build}"
pretrain_split=brown_informative
ft_split="${FT_SPLIT:-brown_imaginative}"
freeze="${FREEZE:-}"
[[ -z "$freeze" || "$freeze" == embed_head ]] || { echo "forgetting.sh: FREEZE must be empty or embed_head, got '$freeze'" >&2; exit 2; }
out="${OUT:-runs/frontier_${ft_split}${freeze:+_frozen}}"
np="${NP:-2}"
pretrain_steps="${PRETRAIN_STEPS:-2000}"
ft_steps="${FT_STEPS:-100}"
pretrain_dir="${PRETRAIN_DIR:-runs/frontier/pretrain}"
pretrain_per_seed="${PRETRAIN_PER_SEED:-0}"
[[ "$pretrain_per_seed" == 0 || "$pretrain_per_seed" == 1 ]] ||
  { echo "forgetting.sh: PRETRAIN_PER_SEED must be 0 or 1, got '$pretrain_per_seed'" >&2; exit 2; }
data="${DATA_DIR:-data}"
extra_sets=()
read -ra kvs <<< "${SETS:-}"  # split on spaces, no globbing
for kv in "${kvs[@]}"; do extra_sets+=(--set "$kv"); done
seeds="${SEEDS:-1 2}"
adamw_lrs="${ADAMW_LRS:-3e-4 1e-3 3e-3 1e-2}"
osft_urrs="${OSFT_URRS:-0.5 0.25}"
osft_lrs="${OSFT_LRS:-1e-3 3e-3 1e-2}"
# --count: the grid's size and how many of its runs are not in OUT/runs.tsv yet ("runs left"),
# then stop (experiments/forgetting/forgetting_all.sh plans with it).
seed_run_names() {  # seed: the names of the seed's grid runs
  printf "adamw_lr%s_seed$1 " $adamw_lrs
  local urr
  for urr in $osft_urrs; do printf "osft_urr${urr}_lr%s_seed$1 " $osft_lrs; done
}
if [[ "${1:-}" == --count ]]; then
  total=0 left=0
  for seed in $seeds; do
    for name in $(seed_run_names "$seed"); do
      total=$((total + 1))
      grep -qs "^$name	" "$out/runs.tsv" || left=$((left + 1))
    done
  done
  echo "$total $left"
  exit 0
fi
[[ $# -eq 0 ]] || { echo "usage: $0 [--count] (knobs in the environment)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Several threads per rank need as many cores: Open MPI binds each rank to one core at np <= 2.
bind=()
if ((OMP_NUM_THREADS > 1)); then bind=(--bind-to none); fi
engine="$build/apps/engine/engine"
[[ -x "$engine" ]] || { echo "forgetting.sh: $engine not built (cmake --build $build --target engine)" >&2; exit 2; }
for split in "$pretrain_split" "$ft_split"; do
  for part in train val; do
    compgen -G "$data/$split/${split}_${part}_*.bin" > /dev/null && continue
    case "$split" in
      brown*) prepare="run bash scripts/prepare_data.sh" ;;
      code) prepare="run bash scripts/prepare_code_data.sh" ;;
      *) prepare="FT_SPLIT is brown_imaginative, brown_informative or code" ;;
    esac
    echo "forgetting.sh: no $data/$split/${split}_${part}_*.bin shards: $prepare" >&2
    exit 2
  done
done
mkdir -p "$out"
# One grid per OUT: its runs must share the fine-tuning split, the freezing and the step counts.
grid="FT_SPLIT=$ft_split FREEZE=$freeze PRETRAIN_STEPS=$pretrain_steps FT_STEPS=$ft_steps"
[[ "$pretrain_per_seed" == 1 ]] && grid+=" PRETRAIN_PER_SEED=1"
if [[ -f "$out/grid" ]]; then
  [[ "$(cat "$out/grid")" == "$grid" ]] ||
    { echo "forgetting.sh: $out holds the grid '$(cat "$out/grid")', not '$grid': give another OUT" >&2; exit 2; }
else
  echo "$grid" > "$out/grid"
fi
run() { mpirun --oversubscribe "${bind[@]}" -np "$np" "$engine" "$@"; }
split_sets() {  # train and val shards of one split
  echo --set "data.train=$data/$1/$1_train_*.bin" --set "data.val=$data/$1/$1_val_*.bin"
}
# The validation loss of a checkpoint on one split's whole validation set.
val_loss() {
  run eval --checkpoint "$1" --all --set "data.val=$data/$2/$2_val_*.bin" 2>&1 |
    sed -n 's/.*val_loss:\([0-9.]*\).*/\1/p' | tail -1
}
# The complete checkpoint of a run folder at a step, or nothing.
final_checkpoint() {
  local c="$1/checkpoints/step_$(printf '%08d' "$2")"
  [[ -f "$c/manifest.yaml" ]] && echo "$c" || true  # the manifest is written last, then the folder renamed
}
elapsed_file="$out/elapsed_s"
[[ -f "$elapsed_file" ]] || echo 0 > "$elapsed_file"
session_start=$SECONDS
add_elapsed() { echo $(( $(cat "$elapsed_file") + SECONDS - session_start )) > "$elapsed_file"; session_start=$SECONDS; }
trap add_elapsed EXIT

# ---- 1. pretraining ------------------------------------------------------------------------------
# The final checkpoint of a pretraining into a folder, trained first (resuming) when it is missing.
pretrain() {  # dir [--set ...]
  local dir=$1 ckpt
  shift
  ckpt="$(final_checkpoint "$dir" "$pretrain_steps")"
  if [[ -z "$ckpt" ]]; then
    echo "== pretraining on $pretrain_split into $dir ($pretrain_steps steps; resumes where it stopped)" >&2
    mkdir -p "$(dirname "$dir")"
    run --config configs/cpu_small.yaml $(split_sets "$pretrain_split") \
      --set "train.steps=$pretrain_steps" --set train.eval_every=100 --set checkpoint.every=250 \
      --set checkpoint.keep=2 --set checkpoint.resume=auto \
      --set "checkpoint.dir=$dir/checkpoints" --set "log.dir=$dir" "$@" "${extra_sets[@]}" \
      >> "$dir.log" 2>&1 ||
      { echo "forgetting.sh: the pretraining failed (exit $?; see $dir.log)" >&2; exit 1; }
    ckpt="$(final_checkpoint "$dir" "$pretrain_steps")"
    [[ -n "$ckpt" ]] || { echo "forgetting.sh: pretraining left no step $pretrain_steps checkpoint (see $dir.log)" >&2; exit 1; }
  fi
  echo "$ckpt"
}
# Both splits' losses of a checkpoint, tab-separated (the control's two splits are one: once).
both_losses() {
  local pre ft
  pre="$(val_loss "$1" "$pretrain_split")"
  if [[ "$ft_split" == "$pretrain_split" ]]; then ft="$pre"; else ft="$(val_loss "$1" "$ft_split")"; fi
  [[ -n "$pre" && -n "$ft" ]] || { echo "forgetting.sh: no val_loss from engine eval of $1" >&2; exit 1; }
  printf '%s\t%s' "$pre" "$ft"
}
# What a pretrained model is: the sha256 of its checkpoint's files (every rank's weights, optimizer
# state and RNG; the manifest, which holds their checksums and the write's time, left out).
model_sum() {
  (cd "$1" && find . -type f ! -name manifest.yaml | LC_ALL=C sort | xargs sha256sum) |
    sha256sum | cut -d' ' -f1
}
runs="$out/runs.tsv"
[[ -f "$runs" ]] ||
  printf 'run\tmethod\turr\tlr\tseed\t%s\t%s\tseconds\n' "$pretrain_split" "$ft_split" > "$runs"
header="$(head -n1 "$runs" | cut -f6,7 | sed 's/^informative/brown_informative/; s/\timaginative$/\tbrown_imaginative/')"
[[ "$header" == "$pretrain_split	$ft_split" ]] ||
  { echo "forgetting.sh: $runs holds losses on '${header/	/, }', not on $pretrain_split, $ft_split: give another OUT" >&2; exit 2; }
seed_runs_left() {  # seed: how many of the seed's grid runs are not in runs.tsv yet
  local name n=0
  for name in $(seed_run_names "$1"); do
    grep -q "^$name	" "$runs" || n=$((n + 1))
  done
  echo "$n"
}
# The model a seed's runs start from. PRETRAIN_PER_SEED=1: the seed's own pretraining
# (train.seed = the seed, PRETRAIN_DIR_seed<seed>), its row pretrained_seed<seed> in runs.tsv and
# its model_sum in OUT/pretrained_seed<seed>.sha256. A fresh clone has no checkpoint and trains it
# again: on another CPU the bits differ, and the seed's runs, which started from the other model,
# are moved to OUT/stale_seed<seed>_<time>/ and trained again. Otherwise every seed shares one.
pretrained_for_seed() {  # seed
  local seed=$1 ckpt sum sum_file stale row losses
  if [[ "$pretrain_per_seed" != 1 ]]; then
    ckpt="$(pretrain "$pretrain_dir")"
    if ! grep -q '^pretrained	' "$runs"; then
      losses="$(both_losses "$ckpt")"
      printf 'pretrained\tpretrained\t-\t-\t-\t%s\t0\n' "$losses" >> "$runs"
    fi
    echo "$ckpt"
    return
  fi
  ckpt="$(pretrain "${pretrain_dir}_seed$seed" --set "train.seed=$seed")"
  sum="$(model_sum "$ckpt")"
  sum_file="$out/pretrained_seed$seed.sha256"
  if [[ -f "$sum_file" && "$(cat "$sum_file")" != "$sum" ]]; then
    stale="$out/stale_seed${seed}_$(date -u +%Y%m%dT%H%M%S)"
    echo "forgetting.sh: seed $seed's pretraining is not the model its runs in $runs started from" \
      "(sha256 $sum, not $(cat "$sum_file")): they move to $stale and train again" >&2
    mkdir -p "$stale"
    head -n1 "$runs" > "$stale/runs.tsv"
    awk -F'\t' -v s="$seed" 'NR > 1 && $5 == s' "$runs" >> "$stale/runs.tsv"
    for row in $(awk -F'\t' -v s="$seed" 'NR > 1 && $5 == s { print $1 }' "$runs"); do
      [[ -d "$out/$row" ]] && mv "$out/$row" "$stale/"
    done
    mv "$sum_file" "$stale/"
    awk -F'\t' -v s="$seed" 'NR == 1 || $5 != s' "$runs" > "$runs.tmp" && mv "$runs.tmp" "$runs"
  fi
  echo "$sum" > "$sum_file"
  if ! grep -q "^pretrained_seed$seed	" "$runs"; then
    losses="$(both_losses "$ckpt")"
    printf 'pretrained_seed%s\tpretrained\t-\t-\t%s\t%s\t0\n' "$seed" "$seed" "$losses" >> "$runs"
  fi
  echo "$ckpt"
}

# ---- 2. the grid, seed by seed (a partial grid is a whole frontier of its first seeds) ----------
finetune() {  # name config urr lr seed [--set ...]
  local name=$1 config=$2 urr=$3 lr=$4 seed=$5
  shift 5
  grep -q "^$name	" "$runs" && return 0
  local dir="$out/$name" t0=$SECONDS
  echo "== $name: $ft_steps steps on $ft_split"
  run --config "$config" $(split_sets "$ft_split") --set "train.init_from=$pretrained" \
    --set "train.seed=$seed" --set data.shuffle=true --set "train.steps=$ft_steps" \
    --set train.eval_every=0 --set train.diverge_loss_factor=0 --set checkpoint.every=50 --set checkpoint.keep=1 \
    --set checkpoint.resume=auto --set "checkpoint.dir=$dir/checkpoints" --set "log.dir=$dir" \
    "$@" "${extra_sets[@]}" >> "$dir.log" 2>&1 ||
    { echo "forgetting.sh: $name failed (exit $?; see $dir.log; run again to resume)" >&2; exit 1; }
  local ckpt
  ckpt="$(final_checkpoint "$dir" "$ft_steps")"
  [[ -n "$ckpt" ]] || { echo "forgetting.sh: $name left no step $ft_steps checkpoint (see $dir.log)" >&2; exit 1; }
  local losses
  losses="$(both_losses "$ckpt")"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "${name%%_*}" "$urr" "$lr" "$seed" "$losses" \
    "$((SECONDS - t0))" >> "$runs"
  rm -rf "$dir/checkpoints"  # the numbers are in runs.tsv; 4 MB a run otherwise
}
# FREEZE=embed_head: each arm's optimizer groups, the hidden matrices first (so optim.0 is the
# arm's own optimizer and the logged lr is the run's), then the embedding and head held at lr 0,
# then whatever else the model has at the run's lr (optional: cpu_small has nothing else).
hidden='["blocks.*.attn.qkv.weight", "blocks.*.attn.proj.weight", "blocks.*.mlp.fc.weight", "blocks.*.mlp.proj.weight"]'
adamw_hyper='betas: [0.9, 0.95], eps: 1.0e-8, eps_mode: torch, weight_decay: 0.0'
frozen_groups() {  # the hidden-matrix group; prints the optim list
  echo "optim=[$1, {params: [embed.weight, lm_head.weight], optimizer: adamw, lr: 0.0, $adamw_hyper}, {params: ['*'], optimizer: adamw, lr: $2, $adamw_hyper, optional: true}]"
}
for seed in $seeds; do
  (($(seed_runs_left "$seed") > 0)) || continue
  pretrained="$(pretrained_for_seed "$seed")"
  for lr in $adamw_lrs; do
    sets=(--set "optim.0.lr=$lr")
    [[ -n "$freeze" ]] &&
      sets=(--set "$(frozen_groups "{params: $hidden, optimizer: adamw, lr: $lr, $adamw_hyper}" "$lr")")
    finetune "adamw_lr${lr}_seed$seed" configs/osft_finetune_baseline.yaml - "$lr" "$seed" "${sets[@]}"
  done
  for urr in $osft_urrs; do
    for lr in $osft_lrs; do
      sets=(--set "optim.0.unfreeze_rank_ratio=$urr" --set "optim.0.lr=$lr" --set "optim.1.lr=$lr")
      osft="{params: $hidden, optimizer: osft, unfreeze_rank_ratio: $urr, lr: $lr, betas: [0.9, 0.95], weight_decay: 0.0}"
      [[ -n "$freeze" ]] && sets=(--set "$(frozen_groups "$osft" "$lr")")
      finetune "osft_urr${urr}_lr${lr}_seed$seed" configs/osft_finetune.yaml "$urr" "$lr" "$seed" "${sets[@]}"
    done
  done
done
add_elapsed

# ---- 3. the frontier ------------------------------------------------------------------------------
/usr/bin/python3 experiments/forgetting/forgetting_frontier.py "$out" --pretrain-steps "$pretrain_steps" \
  --finetune-steps "$ft_steps" --np "$np" --elapsed "$(cat "$elapsed_file")"
