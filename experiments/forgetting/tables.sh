#!/usr/bin/env bash
# tables.sh [--no-plot] [DEST]: every forgetting frontier, regenerated from the committed runs.tsv
# of each grid (results/<grid>/: one row per run, both splits' whole validation losses), training
# nothing. forgetting_frontier.py takes the step counts, np and the grid's hours from the grid's
# committed frontier.json (what forgetting.sh recorded; they enter only the tables' captions).
# DEST (default: results/, in place) receives <grid>/frontier.{md,json,png}; --no-plot leaves the
# figures out. tests/experiments runs it into a temporary DEST and compares every table with the
# committed one, byte for byte.
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then  # the header above is the usage
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
  exit 0
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
here=experiments/forgetting
results=$here/results
plot=()
if [[ "${1:-}" == --no-plot ]]; then plot=(--no-plot); shift; fi
[[ $# -le 1 ]] || { echo "usage: $0 [--no-plot] [DEST]" >&2; exit 2; }
dest="${1:-$results}"
for grid in issue38 brown_imaginative brown_imaginative_frozen brown_informative code brown_imaginative_per_seed; do
  [[ -f "$results/$grid/runs.tsv" ]] || continue  # a grid not yet collected
  mkdir -p "$dest/$grid"
  [[ "$dest/$grid" -ef "$results/$grid" ]] || cp "$results/$grid/runs.tsv" "$dest/$grid/"
  read -r pretrain ft np elapsed < <(/usr/bin/python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
print(d["pretrain_steps"], d["finetune_steps"], d["np"], d["elapsed_s"])' "$results/$grid/frontier.json")
  /usr/bin/python3 $here/forgetting_frontier.py "$dest/$grid" --pretrain-steps "$pretrain" \
    --finetune-steps "$ft" --np "$np" --elapsed "$elapsed" "${plot[@]}" >/dev/null
done
