#!/usr/bin/env bash
# Usage: expect_abort.sh MPIEXEC HELPER MODE
# Runs `MPIEXEC -np 4 HELPER MODE` (a hang is killed after 60 s and fails the test) and passes
# when it ended within 30 s and:
#   guarded, terminate (rank 2 fails alone): non-zero status, and stderr names the failing rank
#     and the message;
#   collective (every rank throws the same ExitStatusError of status 5): status 5, the message
#     exactly once, and no abort (no MPI_ABORT banner, no "rank R:" prefix).
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
if [ "$elapsed_ms" -ge 30000 ]; then echo "FAIL: took ${elapsed_ms} ms (limit 30 s)"; ok=0; fi
if [ "$mode" = collective ]; then
  if [ "$status" -ne 5 ]; then echo "FAIL: exit status $status, expected 5"; ok=0; fi
  count=$(grep -c "injected failure (collective) seen by every rank" "$log")
  if [ "$count" -ne 1 ]; then echo "FAIL: the message was printed $count times, expected once"; ok=0; fi
  if grep -q "MPI_ABORT\|^rank [0-9]*: " "$log"; then echo "FAIL: the job was aborted"; ok=0; fi
else
  if [ "$status" -eq 0 ]; then echo "FAIL: job exited 0"; ok=0; fi
  if [ "$status" -eq 137 ]; then echo "FAIL: job hung and was killed"; ok=0; fi
  if ! grep -q "rank 2: .*injected failure ($mode)" "$log"; then
    echo "FAIL: no 'rank 2: ... injected failure ($mode)' message"; ok=0
  fi
fi
rm -f "$log"
[ "$ok" -eq 1 ]
