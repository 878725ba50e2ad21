#!/usr/bin/env bash
# forgetting_frozen.sh: the forgetting frontier with the embedding and head frozen in both arms
# (issue 50, section 2). cpu_small's embedding and head hold 12.9 M of its 13.7 M parameters and
# train freely at the run's lr in experiments/forgetting/forgetting.sh's arms, so that frontier mostly compares
# the same AdamW on the same weights; here both arms hold them at lr 0 (FREEZE=embed_head) and
# only the hidden matrices move, by AdamW or by OSFT, the weights OSFT constrains. The pretraining
# is the one every grid shares (PRETRAIN_DIR, default runs/frontier/pretrain, trained by the first
# grid that runs; the same seed and steps give the same weights). With only the hidden matrices
# moving the best rates may be higher than the unfrozen grid's, so the grid reaches one step
# further up. Any fine-tuning split (FT_SPLIT, default brown_imaginative; forgetting.sh).
# Resumable like forgetting.sh (a run whose row is in runs.tsv is skipped); results in
# runs/frontier_<FT_SPLIT>_frozen/ (runs.tsv, frontier.{md,json,png}, each run's metrics.jsonl
# and log.txt).
#
#   nohup nice -n 10 bash experiments/forgetting/forgetting_frozen.sh > runs/forgetting_frozen.log 2>&1 &
#
# The run list: seeds 1 2 3; AdamW (hidden matrices) at 3e-4 1e-3 3e-3 1e-2 3e-2; OSFT at
# unfreeze_rank_ratio 0.5 and 0.25, each at 3e-4 1e-3 3e-3 1e-2 3e-2: 45 fine-tuning runs of 100
# steps. (3e-4 was added after the first two seeds: with the hidden matrices alone OSFT 0.25's
# gains at 1e-3 lay below every AdamW run's, so the two frontiers did not meet there.)
# Knobs of forgetting.sh given in the environment win over these.
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then  # the header above is the usage
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
  exit 0
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export FREEZE=embed_head
export SEEDS="${SEEDS:-1 2 3}"
export ADAMW_LRS="${ADAMW_LRS:-3e-4 1e-3 3e-3 1e-2 3e-2}"
export OSFT_URRS="${OSFT_URRS:-0.5 0.25}"
export OSFT_LRS="${OSFT_LRS:-3e-4 1e-3 3e-3 1e-2 3e-2}"
exec bash "$repo/experiments/forgetting/forgetting.sh" "$@"
