#!/usr/bin/env bash
# bench_model --keys: a row for the model without the recipe's keys and one per key asked for,
# each compared with the first; an unknown key is refused by name before anything runs.
#
#   bench_model_keys_test.sh BENCH_MODEL
set -euo pipefail
bench=$1
out=$("$bench" --keys window,value_embeds --steps 1 --rounds 1 --threads 1 --json)
[ "$(grep -c '"step_vs_none"' <<<"$out")" -eq 3 ] || { echo "FAIL: expected 3 rows:"; echo "$out"; exit 1; }
for key in none window value_embeds; do
  grep -q "\"key\": \"$key\"" <<<"$out" || { echo "FAIL: no row for $key"; echo "$out"; exit 1; }
done
# value embeddings add a vocabulary-sized table: more parameters than the plain model
python3 - "$out" <<'PY'
import json, sys
rows = {r["key"]: r for r in map(json.loads, sys.argv[1].splitlines())}
assert rows["none"]["step_vs_none"] == 1.0, rows["none"]
assert rows["value_embeds"]["params"] > rows["none"]["params"] + 50257 * 128 - 1, rows
assert rows["window"]["params"] == rows["none"]["params"], rows
PY
if "$bench" --keys nosuch --steps 1 2>"${TMPDIR:-/tmp}/bench_keys_err.$$"; then
  echo "FAIL: an unknown key was accepted"; exit 1
fi
grep -q "unknown --keys entry 'nosuch'" "${TMPDIR:-/tmp}/bench_keys_err.$$" || { echo "FAIL: the error does not name the key"; exit 1; }
rm -f "${TMPDIR:-/tmp}/bench_keys_err.$$"
echo "PASS: bench_model --keys"
