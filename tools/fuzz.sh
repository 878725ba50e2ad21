#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang with AddressSanitizer + UndefinedBehaviorSanitizer)
# and runs each for a set time, starting from the seed corpus in fuzz/corpus/<target>.
#
#   tools/fuzz.sh [--seconds N] [--jobs J] [target ...]
#
# N seconds per target (default 60), J targets at a time (default 2); targets default to all
# (config json shard safetensors manifest checkpoint tokenizer tokenizer_files hf_folder). New
# inputs go to build-fuzz/corpus/<target> (the seeds in the repository stay as they are); a crash
# leaves its input in build-fuzz/artifacts/<target>/ and makes the script exit non-zero, naming
# the target and the file. Each target's final statistics (runs, coverage) are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
jobs=2
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(config json shard safetensors manifest checkpoint tokenizer tokenizer_files hf_folder)

build=${FUZZ_BUILD_DIR:-build-fuzz}
cmake -S fuzz -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build "$build" --parallel "$(nproc)"

run_one() {
  local t=$1
  mkdir -p "$build/corpus/$t" "$build/artifacts/$t"
  # -rss_limit_mb: a parser must not need gigabytes for a small input; -timeout (wall clock,
  # generous for a loaded machine): nor tens of seconds. The outer timeout bounds the target
  # itself: after an out-of-memory report libFuzzer prints AddressSanitizer's heap profile, which
  # took over 30 minutes for millions of small blocks (the config parser's endless loop).
  local status=0
  timeout -k 10 $((seconds + 120)) "$build/${t}_fuzz" "$build/corpus/$t" "fuzz/corpus/$t" \
    -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$t/" >"$build/$t.log" 2>&1 || status=$?
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "ERROR: the target ran past $((seconds + 120)) s and was stopped" >>"$build/$t.log"
  fi
}

failed=()
running=0
pids=()
names=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  names+=("$t")
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" 2>/dev/null || true
done
for t in "${targets[@]}"; do
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$build/$t.log" | awk '{print $2}')
  cov=$(grep -o 'cov: [0-9]*' "$build/$t.log" | tail -1 | awk '{print $2}')
  # A crash, sanitizer report, timeout, leak or out-of-memory (slow-unit notes are not failures).
  if grep -qE 'ERROR: |SUMMARY: |Test unit written to .*(crash|timeout|leak|oom)-' "$build/$t.log"; then
    failed+=("$t")
    echo "fuzz $t: FAILED"
    grep -E 'ERROR: |SUMMARY: |Test unit written|#[0-9]+ 0x' "$build/$t.log" | head -12
  else
    echo "fuzz $t: ${seconds} s, ${runs:-?} runs, coverage ${cov:-?} edges, no crash"
  fi
done
[ ${#failed[@]} -eq 0 ] || { echo "fuzz: crashes in ${failed[*]} (inputs under $build/artifacts/)"; exit 1; }
