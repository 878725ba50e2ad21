#!/usr/bin/env bash
# forgetting_all.sh [--plan | --collect]: every forgetting grid of issue 50's second pass, one
# after the other in a fixed order, each into its own OUT (runs/frontier_<grid>), all sharing one
# pretraining (PRETRAIN_DIR, default runs/frontier/pretrain; experiments/forgetting/forgetting.sh):
#   brown_imaginative         the arms of issue 38 on a denser lr grid and 3 seeds
#   brown_imaginative_frozen  both arms with the embedding and head at lr 0 (forgetting_frozen.sh)
#   brown_informative         the control: fine-tuning on the pretraining split itself
#   code                      another domain: eslint's JavaScript source (prepare_code_data.sh),
#                             each seed from its own pretraining (forgetting.sh's
#                             PRETRAIN_PER_SEED: a seed's pretraining and runs fit in one sitting,
#                             and a fresh clone keeps no checkpoint), OSFT at ratio 0.5 alone
#   brown_imaginative_per_seed  issue 65: brown_imaginative with each seed from its own
#                             pretraining (so the seeds sample the pretraining too, not only the
#                             fine-tuning data order), AdamW also at 3.5e-4 4e-4 5e-4 (inside the
#                             frontier's 3e-4 -> 1e-3 segment that carried the low-gain claim)
#                             and OSFT also at 5e-3 (between its best gain and 1e-2)
# The unfrozen grids' run list: seeds 1 2 3; AdamW at 3e-4 1e-3 1.5e-3 2e-3 3e-3 1e-2; OSFT at
# unfreeze_rank_ratio 0.5 and 0.25, each at 3e-4 1e-3 3e-3 1e-2 (the frozen grid's is
# forgetting_frozen.sh's). After each grid, and once more at the end, its frontier is
# regenerated and copied to experiments/forgetting/results/<grid>/ (runs.tsv, grid,
# frontier.{md,json,png}, and runs.jsonl.xz: every run's log.txt and metrics.jsonl, thinned to
# the step, losses, lr, gradient norm and train time; experiments/runpack.py), the shared
# pretraining's logs to results/pretrain/runs.jsonl.xz (the code grid's, run pretrain_seed<S>,
# to its own pack, with pretrained_seed<S>.sha256); committing them is left to whoever runs this.
# Resumable: run the same command again; a grid's finished runs are skipped (forgetting.sh). On a
# fresh clone (no OUT yet) a grid's committed runs.tsv, grid and sha256 files are copied into its
# OUT first, so it goes on where the commits stop (the pack keeps the logs of the runs whose
# folders are gone).
#
#   mkdir -p runs && nohup nice -n 10 bash experiments/forgetting/forgetting_all.sh > runs/forgetting_all.log 2>&1 &
#
# --plan prints the run counts (restoring a fresh clone's committed runs first, as a run does)
# and the hours they are estimated to take, and stops; --collect
# regenerates the frontiers of whatever runs are finished and copies them, running nothing (safe
# beside a running grid). The estimate takes the seconds per run of the issue 38 grid
# (results/issue38/runs.tsv: 100 fine-tuning steps and two whole-split evaluations at np 2 on the
# shared 2-core machine), scaled by FT_STEPS / 100, and the pretraining at that per-step rate.
# Knobs (environment; each applies to every grid): GRIDS (the list above, in its order), SEEDS,
# ADAMW_LRS, OSFT_URRS (the code grid's too), OSFT_LRS, PRETRAIN_STEPS, FT_STEPS, NP, BUILD_DIR, PRETRAIN_DIR,
# RUNS_DIR (runs: the grids' OUTs are RUNS_DIR/frontier_<grid>), DOCS_DIR
# (experiments/forgetting/results).
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then  # the header above is the usage
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
  exit 0
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
mode="${1:-run}"
[[ "$mode" == run || "$mode" == --plan || "$mode" == --collect ]] ||
  { echo "usage: $0 [--plan | --collect]" >&2; exit 2; }
grids="${GRIDS:-brown_imaginative brown_imaginative_frozen brown_informative code brown_imaginative_per_seed}"
export SEEDS="${SEEDS:-1 2 3}"
export PRETRAIN_DIR="${PRETRAIN_DIR:-runs/frontier/pretrain}"
export PRETRAIN_STEPS="${PRETRAIN_STEPS:-2000}" FT_STEPS="${FT_STEPS:-100}" NP="${NP:-2}"
runs_dir="${RUNS_DIR:-runs}"
docs_dir="${DOCS_DIR:-experiments/forgetting/results}"
here=experiments/forgetting
# What a pack keeps of each metrics row (the tables read runs.tsv; the rows are the curves: every
# 10th step's training row and every validation).
keep=step,train_loss,val_loss,lr,grad_norm,elapsed_ms
dense_adamw="${ADAMW_LRS:-3e-4 1e-3 1.5e-3 2e-3 3e-3 1e-2}"
dense_urrs="${OSFT_URRS:-0.5 0.25}"
dense_osft="${OSFT_LRS:-3e-4 1e-3 3e-3 1e-2}"
code_urrs="${OSFT_URRS:-0.5}"
per_seed_adamw="${ADAMW_LRS:-3e-4 3.5e-4 4e-4 5e-4 1e-3 1.5e-3 2e-3 3e-3 1e-2}"
per_seed_osft="${OSFT_LRS:-3e-4 1e-3 3e-3 5e-3 1e-2}"
for grid in $grids; do
  case "${grid%_frozen}" in
    brown_imaginative | brown_informative | code | brown_imaginative_per_seed) ;;
    *) echo "forgetting_all.sh: GRIDS: unknown grid '$grid' (a split of brown_imaginative, brown_informative, code, each optionally _frozen, or brown_imaginative_per_seed)" >&2; exit 2 ;;
  esac
done

# One grid's command: forgetting.sh with the dense lists, or forgetting_frozen.sh with its own
# (the environment's lists, when given, win in both); extra arguments go to forgetting.sh.
grid_out() { echo "$runs_dir/frontier_$1"; }
grid_script() {
  local grid=$1
  shift
  if [[ "$grid" == *_frozen ]]; then
    FT_SPLIT="${grid%_frozen}" OUT="$(grid_out "$grid")" bash $here/forgetting_frozen.sh "$@"
  elif [[ "$grid" == code ]]; then
    FT_SPLIT=code OUT="$(grid_out code)" ADAMW_LRS="$dense_adamw" OSFT_URRS="$code_urrs" \
      OSFT_LRS="$dense_osft" PRETRAIN_PER_SEED=1 bash $here/forgetting.sh "$@"
  elif [[ "$grid" == brown_imaginative_per_seed ]]; then
    FT_SPLIT=brown_imaginative OUT="$(grid_out "$grid")" ADAMW_LRS="$per_seed_adamw" \
      OSFT_URRS="$dense_urrs" OSFT_LRS="$per_seed_osft" PRETRAIN_PER_SEED=1 bash $here/forgetting.sh "$@"
  else
    FT_SPLIT="$grid" OUT="$(grid_out "$grid")" ADAMW_LRS="$dense_adamw" OSFT_URRS="$dense_urrs" \
      OSFT_LRS="$dense_osft" bash $here/forgetting.sh "$@"
  fi
}
# A fresh clone: a grid's committed files become its OUT's, so the grid goes on where the
# commits stop (forgetting.sh skips every run in runs.tsv; the logs stay in the committed pack,
# which collect keeps for the runs whose folders are not in OUT).
restore() {
  local grid=$1 out src
  out="$(grid_out "$grid")"
  src="$docs_dir/$grid"
  [[ -f "$out/runs.tsv" || ! -f "$src/runs.tsv" ]] && return 0
  mkdir -p "$out"
  cp "$src/runs.tsv" "$src/grid" "$out/"
  cp "$src"/pretrained_seed*.sha256 "$out/" 2>/dev/null || true
  /usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["elapsed_s"])' \
    "$src/frontier.json" > "$out/elapsed_s" 2>/dev/null || echo 0 > "$out/elapsed_s"
  echo "forgetting_all.sh: $grid: $(finished_runs "$grid") finished runs restored from $src"
}
finished_runs() {  # rows of finished fine-tuning runs in a grid's runs.tsv
  local tsv
  tsv="$(grid_out "$1")/runs.tsv"
  if [[ -f "$tsv" ]]; then awk -F'\t' 'NR > 1 && $2 != "pretrained"' "$tsv" | wc -l; else echo 0; fi
}

plan() {
  local s_per_run total=0 left=0 n n_left s_left
  # Mean seconds per fine-tuning run of the issue 38 grid (100 steps), scaled to FT_STEPS.
  s_per_run="$(awk -F'\t' -v steps="$FT_STEPS" 'NR > 1 && $1 != "pretrained" { s += $8; n++ }
    END { printf "%.0f", s / n * steps / 100 }' $here/results/issue38/runs.tsv)"
  # The pretrainings still to train while a grid has runs left: the shared one, once, and each
  # seed's (shared by the code and per-seed grids) that has no checkpoint.
  local shared=0 per_seed=0 seed step
  local -A seeds_counted=()
  step="step_$(printf '%08d' "$PRETRAIN_STEPS")"
  printf '%-28s %6s %6s\n' grid runs left
  for grid in $grids; do
    read -r n n_left <<< "$(grid_script "$grid" --count)"
    printf '%-28s %6d %6d\n' "$grid" "$n" "$n_left"
    total=$((total + n)); left=$((left + n_left))
    ((n_left > 0)) || continue
    if [[ "$grid" == code || "$grid" == *_per_seed ]]; then  # these grids share each seed's
      for seed in $SEEDS; do
        [[ -f "${PRETRAIN_DIR}_seed$seed/checkpoints/$step/manifest.yaml" || -n "${seeds_counted[$seed]:-}" ]] ||
          per_seed=$((per_seed + 1))
        seeds_counted[$seed]=1
      done
    elif [[ ! -f "$PRETRAIN_DIR/checkpoints/$step/manifest.yaml" ]]; then
      shared=1
    fi
  done
  s_left=$((left * s_per_run))
  local pretrainings=$((shared + per_seed))
  local pre_s=$((pretrainings * PRETRAIN_STEPS * s_per_run / FT_STEPS))
  printf '%-28s %6d %6d\n' all "$total" "$left"
  awk -v r="$s_left" -v p="$pre_s" -v spr="$s_per_run" -v steps="$PRETRAIN_STEPS" 'BEGIN {
    printf "estimate: %.1f h in all (%d runs left at %d s each, from the issue 38 grid", (r + p) / 3600, r / (spr > 0 ? spr : 1), spr
    if (p > 0) printf ", and %.1f h of pretraining, %d steps a pretraining at that rate", p / 3600, steps
    printf "; a shared 2-core machine)\n" }'
}

# Regenerates a grid's frontier from its finished runs and copies it to DOCS_DIR/<grid>, every
# run's logs into its pack there (a run whose folder is gone keeps its packed logs); the
# pretraining's logs likewise.
collect() {
  local grid=$1 out dest steps ft_steps
  out="$(grid_out "$grid")"
  dest="$docs_dir/$grid"
  if (($(finished_runs "$grid") == 0)); then
    echo "forgetting_all.sh: $grid: no finished run yet, nothing to collect"
    return 0
  fi
  steps="$(sed -n 's/.*PRETRAIN_STEPS=\([0-9]*\).*/\1/p' "$out/grid")"
  ft_steps="$(sed -n 's/.*FT_STEPS=\([0-9]*\).*/\1/p' "$out/grid")"
  /usr/bin/python3 $here/forgetting_frontier.py "$out" --pretrain-steps "$steps" \
    --finetune-steps "$ft_steps" --np "$NP" --elapsed "$(cat "$out/elapsed_s" 2>/dev/null || echo 0)" > /dev/null
  mkdir -p "$dest"
  cp "$out/runs.tsv" "$out/grid" "$out"/frontier.{md,json,png} "$dest/"
  local runs
  read -ra runs <<< "$(awk -F'\t' 'NR > 1 && $2 != "pretrained" { printf "%s ", $1 }' "$out/runs.tsv")"
  if [[ "$grid" == code || "$grid" == *_per_seed ]]; then  # a pretraining per seed: its logs and its model's sha256
    local seed
    for seed in $(awk -F'\t' 'NR > 1 && $2 == "pretrained" { print $5 }' "$out/runs.tsv"); do
      cp "$out/pretrained_seed$seed.sha256" "$dest/"
      runs+=("pretrain_seed$seed=${PRETRAIN_DIR}_seed$seed")
    done
  elif [[ -d "$PRETRAIN_DIR" ]]; then
    /usr/bin/python3 experiments/runpack.py sync "$docs_dir/pretrain/runs.jsonl.xz" . "pretrain=$PRETRAIN_DIR" --keep $keep --every 10
  fi
  /usr/bin/python3 experiments/runpack.py sync "$dest/runs.jsonl.xz" "$out" "${runs[@]}" --keep $keep --every 10
  echo "forgetting_all.sh: $grid: $(finished_runs "$grid") runs -> $dest"
}

case "$mode" in
  --plan)  # a fresh clone's committed runs count as finished, as in a run
    for grid in $grids; do restore "$grid" > /dev/null; done
    plan; exit 0 ;;
  --collect) for grid in $grids; do collect "$grid"; done; exit 0 ;;
esac
mkdir -p "$runs_dir"
exec 9> "$runs_dir/forgetting_all.lock"
flock -n 9 || { echo "forgetting_all.sh: another forgetting_all.sh holds $runs_dir/forgetting_all.lock" >&2; exit 2; }
for grid in $grids; do restore "$grid"; done
plan
for grid in $grids; do
  echo "==== grid $grid -> $(grid_out "$grid") ($(date -u '+%F %T') UTC)"
  grid_script "$grid"
  collect "$grid"
done
echo "==== every frontier, regenerated"
for grid in $grids; do collect "$grid"; done
echo "forgetting_all.sh: done; commit $docs_dir (git add $docs_dir)"
