#!/usr/bin/env bash
# tables.sh [DEST]: the recipe study's tables (tables.md, tables.json), regenerated from the
# committed runs (results/runs.jsonl.xz, results/study.json) and the two earlier records they are
# compared with (records/2026-11-27_recipe, records/2026-11-27_recipe_head_lr_022), training
# nothing. DEST defaults to results/ (in place). tests/experiments runs it into a temporary DEST
# and compares both files with the committed ones, byte for byte.
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then  # the header above is the usage
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
  exit 0
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
here=experiments/recipe_study
[[ $# -le 1 ]] || { echo "usage: $0 [DEST]" >&2; exit 2; }
dest="${1:-$here/results}"
mkdir -p "$dest"
[[ "$dest" -ef "$here/results" ]] || cp "$here/results/runs.jsonl.xz" "$here/results/study.json" "$dest/"
/usr/bin/python3 $here/recipe_study_tables.py "$dest" --quiet
