#!/usr/bin/env bash
# recipe_study.sh [--plan | --collect]: the record recipe on the CPU, second pass (issue 50,
# section 3): the recipe's lrs tuned on an unreported seed, the tuned recipe and the tanh-cap
# variant to the end, the recipe without value embeddings, both configs under one epoch, and the
# per-key probes at 3 seeds; resumable, results copied to experiments/recipe_study/results.
# Stages, knobs and files: experiments/recipe_study/recipe_study.py; docs/records.md.
#
#   mkdir -p runs && nohup nice -n 10 bash experiments/recipe_study/recipe_study.sh > runs/recipe_study.log 2>&1 &
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then  # the header above is the usage
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
  exit 0
fi
exec /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/recipe_study.py" "$@"
