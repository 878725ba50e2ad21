#!/usr/bin/env bash
# Installs what the project needs, builds (both cores) and runs the whole test suite.
# Exits non-zero on any failure.
#
#   scripts/test.sh [ctest args...]             Release build in build/, every test
#   scripts/test.sh --sanitize [ctest args...]  AddressSanitizer + UndefinedBehaviorSanitizer
#                                               build in build-asan/, the unit and multi-rank
#                                               tests (the end-to-end runs are left out: they
#                                               repeat the same code paths, 5-10x slower)
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then  # the header above is the usage
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" | sed '/^#!/d;/^set -/d'
  exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=0
if [ "${1:-}" = "--sanitize" ]; then
  sanitize=1
  shift
fi

bash scripts/setup.sh
if [ "$sanitize" = 1 ]; then
  build=${BUILD_DIR:-build-asan}
  # The CUDA backend stays out: ASan does not instrument device code, and its shadow memory
  # clashes with the CUDA runtime.
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DENGINE_SANITIZE=ON \
    -DENGINE_CUDA=OFF ${CMAKE_ARGS:-}
  # Open MPI's own allocations outlive MPI_Finalize: leak reports would be its, not ours.
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  set -- -E '^e2e_' "$@"
else
  build=${BUILD_DIR:-build}
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
fi
cmake --build "$build" --parallel "$(nproc)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir "$build" --output-on-failure --timeout 600 -j "$(nproc)" "$@"
