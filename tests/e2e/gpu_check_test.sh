#!/usr/bin/env bash
# scripts/gpu_check.sh parses, and on a machine without a GPU stops at once (status 1, before
# installing or building anything) saying so. Skipped (77) where a GPU is present: there the
# script itself is the test.
set -uo pipefail
script="$1/scripts/gpu_check.sh"
bash -n "$script" || { echo "FAIL: $script does not parse"; exit 1; }
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "SKIP: this machine has a GPU; run scripts/gpu_check.sh itself"
  exit 77
fi
start=$(date +%s)
err=$(BUILD_DIR=/nonexistent/gpu_check_build bash "$script" 2>&1 >/dev/null)
status=$?
[ "$status" -eq 1 ] || { echo "FAIL: exit status $status, expected 1"; exit 1; }
echo "$err" | grep -q '^gpu_check: no GPU: ' || { echo "FAIL: no 'no GPU' message, got: $err"; exit 1; }
[ $(($(date +%s) - start)) -le 5 ] || { echo "FAIL: took more than 5 s before refusing"; exit 1; }
[ ! -e /nonexistent/gpu_check_build ] || { echo "FAIL: it created the build folder"; exit 1; }
echo "PASS: $err"
