#!/usr/bin/env bash
# Usage: expect_one_line.sh MPIEXEC HELPER
# Passes when `MPIEXEC -np 4 HELPER collective` (every rank throws the same ExitStatusError of
# status 5) exits 5 within 30 s, prints the message exactly once, and shows no MPI_ABORT banner
# nor a "rank R:" prefix (that of an abort).
set -u
mpiexec=$1 helper=$2
log=$(mktemp)
start=$(date +%s%N)
timeout -s KILL 60 "$mpiexec" --oversubscribe --allow-run-as-root -np 4 "$helper" collective >"$log" 2>&1
status=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
cat "$log"
echo "exit status $status after ${elapsed_ms} ms"
ok=1
if [ "$status" -ne 5 ]; then echo "FAIL: exit status $status, expected 5"; ok=0; fi
if [ "$elapsed_ms" -ge 30000 ]; then echo "FAIL: took ${elapsed_ms} ms (limit 30 s)"; ok=0; fi
count=$(grep -c "injected failure (collective) seen by every rank" "$log")
if [ "$count" -ne 1 ]; then echo "FAIL: the message was printed $count times, expected once"; ok=0; fi
if grep -q "MPI_ABORT\|^rank [0-9]*: " "$log"; then echo "FAIL: the job was aborted"; ok=0; fi
rm -f "$log"
[ "$ok" -eq 1 ]
