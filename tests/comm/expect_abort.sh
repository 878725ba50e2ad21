#!/usr/bin/env bash
# Usage: expect_abort.sh MPIEXEC HELPER MODE
# Passes when `MPIEXEC -np 4 HELPER MODE` exits non-zero within 30 s and its stderr names the
# failing rank and the message; a hang is killed after 60 s and fails the test.
set -u
mpiexec=$1 helper=$2 mode=$3
log=$(mktemp)
start=$(date +%s%N)
timeout -s KILL 60 "$mpiexec" --oversubscribe --allow-run-as-root -np 4 "$helper" "$mode" >"$log" 2>&1
status=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
cat "$log"
echo "exit status $status after ${elapsed_ms} ms"
ok=1
if [ "$status" -eq 0 ]; then echo "FAIL: job exited 0"; ok=0; fi
if [ "$status" -eq 137 ]; then echo "FAIL: job hung and was killed"; ok=0; fi
if [ "$elapsed_ms" -ge 30000 ]; then echo "FAIL: took ${elapsed_ms} ms (limit 30 s)"; ok=0; fi
if ! grep -q "rank 2: .*injected failure ($mode)" "$log"; then
  echo "FAIL: no 'rank 2: ... injected failure ($mode)' message"; ok=0
fi
rm -f "$log"
[ "$ok" -eq 1 ]
