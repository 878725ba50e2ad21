#!/usr/bin/env bash
# The tests again under other OpenBLAS kernels and OpenMP thread counts than scripts/test.sh's
# (which runs them under the kernel OpenBLAS picks for this CPU, 2 threads per single-process
# test and 1 per rank). Another kernel, or another thread split of one GEMM, sums in another
# order: a test whose bar holds for one of them only fails here. Reuses test.sh's build (built
# when missing) and leaves its test settings as they were.
#
#   tools/test_variant.sh [--coretype K[,K...]] [--threads T[,T...]] [--rank-threads R]
#                           [--no-bf16] [ctest args...]
#
#   --coretype       OpenBLAS kernels (OPENBLAS_CORETYPE), each run in turn: Haswell, Zen,
#                    SkylakeX, Cooperlake, ...; a kernel this CPU cannot execute is refused.
#                    Default: Haswell, or Zen where Haswell is this CPU's own.
#   --threads        OMP_NUM_THREADS of each single-process test, each run in turn (default 3)
#   --rank-threads   OMP_NUM_THREADS of each rank of a multi-rank test (default 1, as test.sh;
#                    2 or more oversubscribes 2 cores at np 4 and 8: 5-10x slower)
#   --no-bf16        ENGINE_CPU_NO_BF16=1: bf16 falls back as on a CPU without AVX512_BF16
#   ctest args       which tests, e.g. -L 'core|optim' or -LE heavy (default: all)
#
# Prints one row per variant (kernel, threads, tests, failures, seconds); exits 1 if any failed.
# CI (.ci/run) runs the default variant over the labels whose results depend on the arithmetic.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}

coretypes="" threads=3 rank_threads=1 no_bf16=0
while [ $# -gt 0 ]; do
  case "$1" in
    --coretype) coretypes=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rank-threads) rank_threads=$2; shift 2 ;;
    --no-bf16) no_bf16=1; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done

# The kernel OpenBLAS runs (the library the engine links), under the given OPENBLAS_CORETYPE.
openblas=/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0
[ -e "$openblas" ] || openblas=$(find /usr/lib -name 'libopenblas.so.0' -path '*openmp*' | head -1)
corename() {
  OPENBLAS_CORETYPE=${1:-} python3 -c "import ctypes, sys
lib = ctypes.CDLL(sys.argv[1]); lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())" "$openblas"
}
own=$(corename "")
if [ -z "$coretypes" ]; then
  coretypes=Haswell
  [ "${own,,}" = haswell ] && coretypes=Zen
fi

# A kernel with AVX-512 instructions dies of SIGILL on a CPU without them: refuse it up front.
flags=$(grep -m1 '^flags' /proc/cpuinfo)
can_run() {
  case "${1,,}" in
    skylakex) [[ $flags == *" avx512f "* ]] ;;
    cooperlake) [[ $flags == *" avx512f "* && $flags == *" avx512_bf16 "* ]] ;;
    sapphirerapids) [[ $flags == *" amx_bf16 "* ]] ;;
    *) true ;;
  esac
}

if [ ! -f "$build/CTestTestfile.cmake" ]; then
  bash scripts/setup.sh
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
  cmake --build "$build" --parallel "$(nproc)"
fi
restore() {
  cmake -S . -B "$build" -DENGINE_TEST_THREADS=2 -DENGINE_TEST_RANK_THREADS=1 >/dev/null
}
trap restore EXIT

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bf16="as detected" suffix=""
if [ "$no_bf16" = 1 ]; then
  export ENGINE_CPU_NO_BF16=1
  bf16="forced off" suffix=_nobf16
fi
rows=() failed=0
echo "variant: this CPU's own OpenBLAS kernel is $own; bf16 $bf16"
for kernel in ${coretypes//,/ }; do
  if ! can_run "$kernel"; then
    echo "variant: this CPU cannot execute OpenBLAS's $kernel kernel (no AVX-512 or BF16): refused" >&2
    exit 2
  fi
  got=$(corename "$kernel")
  if [ "${got,,}" != "${kernel,,}" ]; then
    echo "variant: OPENBLAS_CORETYPE=$kernel runs OpenBLAS's $got kernel: not a kernel name" >&2
    exit 2
  fi
  for t in ${threads//,/ }; do
    cmake -S . -B "$build" -DENGINE_TEST_THREADS="$t" -DENGINE_TEST_RANK_THREADS="$rank_threads" >/dev/null
    log="$build/Testing/variant_${kernel}_t${t}_r${rank_threads}$suffix.log"
    echo "variant: OPENBLAS_CORETYPE=$kernel, $t threads per test, $rank_threads per rank: $log"
    start=$(date +%s)
    rc=0
    OPENBLAS_CORETYPE=$kernel ctest --test-dir "$build" --output-on-failure --timeout 600 \
      -j "$(nproc)" "$@" >"$log" 2>&1 || rc=$?
    secs=$(($(date +%s) - start))
    summary=$(grep -E '^[0-9]+% tests passed' "$log" || echo "ctest exit $rc")
    rows+=("| $kernel | $t | $rank_threads | $bf16 | $summary | ${secs} s |")
    if [ "$rc" != 0 ]; then
      failed=1
      sed -n '/The following tests FAILED/,$p' "$log"
    fi
  done
done
echo
echo "| OpenBLAS kernel | threads per test | per rank | bf16 | result | wall |"
echo "| --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
exit "$failed"
