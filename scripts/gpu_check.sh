#!/usr/bin/env bash
# The GPU check on a machine that can install and build: installs what the project needs, builds
# with the CUDA backend in build-gpu/ (BUILD_DIR to change), packs it with scripts/bundle.sh and
# runs scripts/gpu_run.sh on that bundle (every GPU path in time-boxed parts: the CUDA tests,
# the speed side by side with llm.c, several ranks on one GPU, a GPU checkpoint on the CPU, the
# optimizer families, the refresh and the SOAP/REKLS reference). Its summary and logs go to
# BUILD_DIR/gpu_run/.
#
#   scripts/gpu_check.sh [gpu_run.sh options]   e.g. --only tests,speed --budget 600
#   scripts/gpu_check.sh --prebuilt [...]       skip the install and the build: BUILD_DIR holds a
#                                               CUDA build already
#
# For a GPU machine with no package registry, build the bundle elsewhere and run gpu_run.sh there
# (docs/gpu.md). Stops at once, before installing or building anything, where no GPU
# is seen. Exits non-zero when any part fails.
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then  # the header above is the usage
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" | sed '/^#!/d;/^set -/d'
  exit 0
fi
set -uo pipefail
cd "$(dirname "$0")/.."
prebuilt=0
if [ "${1:-}" = "--prebuilt" ]; then
  prebuilt=1
  shift
fi

# ---- a GPU, a driver and the CUDA toolkit, or stop here ---------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu_check: no GPU: nvidia-smi is not installed (no NVIDIA driver on this machine)" >&2
  exit 1
fi
if ! gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null) || [ -z "$gpus" ]; then
  echo "gpu_check: no GPU: nvidia-smi lists no device ($(nvidia-smi -L 2>&1 | head -1))" >&2
  exit 1
fi
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "gpu_check: the CUDA toolkit (nvcc, cuBLAS, cuSOLVER, NCCL) is not installed" >&2
  exit 1
fi
export PATH="$PATH:/usr/local/cuda/bin"
echo "gpu_check: $(echo "$gpus" | wc -l) GPU(s): $(echo "$gpus" | head -1)"

build=${BUILD_DIR:-build-gpu}
if [ "$prebuilt" = 0 ]; then
  bash scripts/setup.sh >"$build.setup.log" 2>&1 || { echo "gpu_check: setup failed, see $build.setup.log" >&2; exit 1; }
  if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=native >"$build.cmake.log" 2>&1 &&
    cmake --build "$build" --parallel "$(nproc)" >"$build.build.log" 2>&1; }; then
    tail -30 "$build.build.log" "$build.cmake.log" 2>/dev/null
    echo "gpu_check: the build failed, see $build.build.log" >&2
    exit 1
  fi
fi
[ -x "$build/apps/engine/engine" ] || { echo "gpu_check: no engine in $build" >&2; exit 1; }
bash scripts/bundle.sh "$build/gpu_bundle" --build "$build" --no-cuda-libs \
  --tests 'tests/.*(cuda|device|nccl|gpu)' >/dev/null || exit 1
exec bash scripts/gpu_run.sh "$build/gpu_run" --bundle "$build/gpu_bundle" "$@"
