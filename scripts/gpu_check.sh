#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: installs what the project needs, builds with the
# CUDA backend, runs the GPU tests (they must run, not skip), trains a GPT-2 124M-sized model on
# GPU 0 for a few dozen steps on synthetic tokens, evaluates its checkpoint on the GPU and on the
# CPU, samples from it on the GPU, times forward + backward with bench_model --device cuda, and
# prints one summary table. Sized for about 10 minutes on one H100.
#
#   scripts/gpu_check.sh             build in build-gpu/ (BUILD_DIR to change), work in it too
#   scripts/gpu_check.sh --prebuilt  skip the install and the build: BUILD_DIR already holds a
#                                    CUDA build (for a GPU machine with no package registry:
#                                    `scripts/bundle.sh OUT` on the build machine, then there
#                                    `source OUT/env.sh; BUILD_DIR=OUT scripts/gpu_check.sh --prebuilt`)
#
# Stops at once, before installing or building anything, where no GPU is seen.
# Exits non-zero when any check fails; the table says which.
set -uo pipefail
export GTEST_COLOR=no
cd "$(dirname "$0")/.."
prebuilt=0
for arg in "$@"; do
  case "$arg" in
    --prebuilt) prebuilt=1 ;;
    *) echo "gpu_check: unknown argument '$arg' (expected --prebuilt)" >&2; exit 2 ;;
  esac
done

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
num_gpus=$(echo "$gpus" | wc -l)
gpu_name=$(echo "$gpus" | head -1)
echo "gpu_check: $num_gpus GPU(s): $gpu_name"

build=${BUILD_DIR:-build-gpu}
work="$build/gpu_check"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Unbound: a rank keeps the OpenMP threads of every core (Open MPI would bind it to one core).
mpirun=(mpirun --oversubscribe --allow-run-as-root --bind-to none)

# The GoogleTest binaries that need a GPU; each runs whole (all its cases) under mpirun -np 1.
gpu_test_binaries=(tests/core/cuda_backend_tests tests/optim/optim_device_replay_tests
  tests/optim/osft_device_replay_tests
  tests/comm/comm_nccl_tests tests/engine/engine_gpu_training_tests)
rows=()
failed=0
t_start=$(date +%s)
# record NAME STATUS DETAIL: one row of the summary table.
record() {
  rows+=("$(printf '%-26s %-5s %s' "$1" "$2" "$3")")
  [ "$2" = "ok" ] || failed=1
}
summary() {
  echo
  echo "==== gpu_check summary: $gpu_name x $num_gpus, $(($(date +%s) - t_start)) s ===="
  printf '%-26s %-5s %s\n' "check" "state" "detail"
  for r in "${rows[@]}"; do echo "$r"; done
}
trap summary EXIT

# ---- install and build --------------------------------------------------------------------------
if [ "$prebuilt" = 1 ]; then
  for b in apps/engine/engine apps/bench_model/bench_model "${gpu_test_binaries[@]}"; do
    [ -x "$build/$b" ] || { echo "gpu_check: --prebuilt, but $build/$b is missing" >&2; exit 1; }
  done
  record "build (ENGINE_CUDA=ON)" ok "prebuilt in $build"
else
  if bash scripts/setup.sh >"$build.setup.log" 2>&1; then
    record "setup" ok "scripts/setup.sh"
  else
    record "setup" FAIL "see $build.setup.log"
    exit 1
  fi
  t0=$(date +%s)
  if cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA=ON \
    >"$build.cmake.log" 2>&1 && cmake --build "$build" --parallel "$(nproc)" >"$build.build.log" 2>&1; then
    record "build (ENGINE_CUDA=ON)" ok "$(($(date +%s) - t0)) s"
  else
    tail -30 "$build.build.log" "$build.cmake.log" 2>/dev/null
    record "build (ENGINE_CUDA=ON)" FAIL "see $build.build.log"
    exit 1
  fi
fi
mkdir -p "$work"

# ---- GPU tests: they must run here --------------------------------------------------------------
# Any skip means a test saw no device: a failure on a GPU machine. Skips that are right here: the
# no-device check, and the tests that need two GPUs when there is one.
expected_skips='CudaAvailability\.NoDeviceMeansAClearError'
[ "$num_gpus" -ge 2 ] || expected_skips+='|GpuTraining\.ZeroStagesOverNcclEqualTheCpu'
for b in "${gpu_test_binaries[@]}"; do
  name=$(basename "$b")
  log="$work/$name.log"
  t0=$(date +%s)
  "${mpirun[@]}" -np 1 "$build/$b" >"$log" 2>&1
  test_status=$?
  passed=$(grep -cE '^\[       OK \]' "$log" || true)
  skipped=$(grep -E '^\[  SKIPPED \] [A-Za-z0-9_]+\.[A-Za-z0-9_]+' "$log" | grep -vcE "$expected_skips" || true)
  if [ "$test_status" -ne 0 ]; then
    grep -E '^\[  FAILED  \]|Failure' "$log" | head -10
    record "$name" FAIL "exit $test_status, $passed passed (see $log)"
  elif [ "$skipped" -ne 0 ]; then
    grep -E '^\[  SKIPPED \]' "$log" | grep -vE "$expected_skips" | head -10
    record "$name" FAIL "$skipped skipped on a GPU machine, $passed passed (see $log)"
  else
    record "$name" ok "$passed passed, 0 unexpected skips, $(($(date +%s) - t0)) s"
  fi
done
if [ "$num_gpus" -ge 2 ]; then
  for b in tests/comm/comm_nccl_tests tests/engine/engine_gpu_training_tests; do
    log="$work/$(basename "$b")_np2.log"
    if "${mpirun[@]}" -np 2 "$build/$b" >"$log" 2>&1; then
      record "$(basename "$b") np 2" ok "$(grep -cE '^\[       OK \]' "$log") passed"
    else
      record "$(basename "$b") np 2" FAIL "see $log"
    fi
  done
fi

# ---- several ranks on one GPU (comm.device_collectives: mpi) against the CPU --------------------
# The tiny configs at np 2 and 4, every rank on GPU 0 (or r mod the GPUs), their tensors moved
# through host buffers over MPI: every ZeRO stage's uneven shards and OSFT's device all-gather on
# a device. Each step's train loss within 1e-4 relative of the CPU run at the same world size;
# then the GPU run's step-10 checkpoint resumed on the CPU at another world size.
python3 tests/e2e/make_tiny_data.py "$work/shared_data" >/dev/null
# shared_run NAME NP CONFIG DEVICE [--set ...]: 20 steps into $work/shared_NAME.
shared_run() {
  local name=$1 np=$2 cfg=$3 device=$4; shift 4
  "${mpirun[@]}" -np "$np" "$build/apps/engine/engine" --config "configs/$cfg" \
    --set device="$device" --set comm.device_collectives=mpi \
    --set "data.train=$work/shared_data/tiny_train_*.bin" \
    --set "data.val=$work/shared_data/tiny_val_*.bin" --set "log.dir=$work/shared_$name" \
    --set "checkpoint.dir=$work/shared_$name/ckpt" --set checkpoint.overwrite=true \
    --set train.steps=20 --set checkpoint.every=10 "$@" >"$work/shared_$name.log" 2>&1
}
# same_losses A B [FIRST_STEP]: the train losses of two runs, step by step, within 1e-4 relative.
same_losses() {
  python3 - "$work/shared_$1/metrics.jsonl" "$work/shared_$2/metrics.jsonl" "${3:-1}" <<'PY'
import json, sys
def losses(path):
    return {r["step"]: r["train_loss"] for r in map(json.loads, open(path)) if "train_loss" in r}
a, b, first = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
steps = [s for s in sorted(b) if s >= first]
worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in steps) if steps and set(steps) <= set(a) else 1
print("%d steps, worst relative %.2e" % (len(steps), worst))
sys.exit(0 if worst <= 1e-4 else 1)
PY
}
for np in 2 4; do
  for stage in 1 3; do
    name="np${np}_stage$stage"
    if shared_run "${name}_cuda" "$np" tiny.yaml cuda --set zero.stage=$stage &&
      shared_run "${name}_cpu" "$np" tiny.yaml cpu --set zero.stage=$stage &&
      detail=$(same_losses "${name}_cuda" "${name}_cpu"); then
      record "one GPU, np $np, ZeRO $stage" ok "cuda = cpu: $detail"
    else
      record "one GPU, np $np, ZeRO $stage" FAIL "${detail:-see $work/shared_${name}_*.log}"
    fi
  done
done
if shared_run osft_cuda 2 osft_tiny.yaml cuda && shared_run osft_cpu 2 osft_tiny.yaml cpu &&
  detail=$(same_losses osft_cuda osft_cpu); then
  record "one GPU, np 2, OSFT" ok "cuda = cpu: $detail"
else
  record "one GPU, np 2, OSFT" FAIL "${detail:-see $work/shared_osft_*.log}"
fi
if shared_run resumed_cpu 4 tiny.yaml cpu --set zero.stage=3 \
  --set "checkpoint.resume=$work/shared_np2_stage3_cuda/ckpt/step_00000010" &&
  detail=$(same_losses resumed_cpu np2_stage3_cuda 11); then
  record "GPU np 2 -> CPU np 4 resume" ok "steps 11-20 against the GPU run: $detail"
else
  record "GPU np 2 -> CPU np 4 resume" FAIL "${detail:-see $work/shared_resumed_cpu.log}"
fi

if python3 tests/e2e/e2e.py --engine "$build/apps/engine/engine" --repo . --work "$work/e2e_device" \
  device >"$work/e2e_device.log" 2>&1; then
  record "e2e device selection" ok "$(tail -1 "$work/e2e_device.log" | cut -c1-90)"
else
  tail -5 "$work/e2e_device.log"
  record "e2e device selection" FAIL "see $work/e2e_device.log"
fi

# ---- a GPT-2 124M-sized run on GPU 0 ------------------------------------------------------------
# Synthetic tokens (tests/e2e/make_tiny_data.py, ids < 50257); 64 Ki tokens per step.
python3 tests/e2e/make_tiny_data.py "$work/data" --train-tokens 2500000 --val-tokens 20000 \
  --vocab 50257 >/dev/null
run_dir="$work/run124m"
sets=(--set device=cuda --set "data.train=$work/data/tiny_train_*.bin"
  --set "data.val=$work/data/tiny_val_*.bin" --set "log.dir=$run_dir"
  --set "checkpoint.dir=$run_dir/ckpt" --set checkpoint.overwrite=true --set checkpoint.every=0
  --set train.steps=30 --set train.batch_tokens=65536 --set train.micro_batch=8
  --set train.val_tokens=8192 --set train.eval_every=0 --set train.warmup_steps=2
  --set train.target_val_loss=0 --set log.every=5 --set zero.stage=1)
t0=$(date +%s)
if "${mpirun[@]}" -np 1 "$build/apps/engine/engine" --config configs/gpt2_124m.yaml "${sets[@]}" \
  >"$work/train.log" 2>&1; then
  last=$(grep -E '^step:30/30' "$work/train.log" | head -1)
  record "train 124M, 30 steps" ok "$(($(date +%s) - t0)) s; ${last:0:110}"
else
  tail -20 "$work/train.log"
  record "train 124M, 30 steps" FAIL "see $work/train.log"
fi
grep -q "rank 0: cuda:0" "$work/train.log" && record "banner names cuda:0" ok "" ||
  record "banner names cuda:0" FAIL "no 'rank 0: cuda:0' line in $work/train.log"

# ---- the checkpoint on both devices: eval on cuda and on cpu, sample on cuda --------------------
ckpt=$(ls -d "$run_dir"/ckpt/step_* 2>/dev/null | tail -1)
if [ -n "$ckpt" ]; then
  val() { grep -oE 'val_loss:[0-9.]+' "$1" | head -1 | cut -d: -f2; }
  "${mpirun[@]}" -np 1 "$build/apps/engine/engine" eval --checkpoint "$ckpt" --set device=cuda \
    >"$work/eval_cuda.log" 2>&1
  "${mpirun[@]}" -np 1 "$build/apps/engine/engine" eval --checkpoint "$ckpt" --set device=cpu \
    >"$work/eval_cpu.log" 2>&1
  vg=$(val "$work/eval_cuda.log")
  vc=$(val "$work/eval_cpu.log")
  if [ -n "$vg" ] && [ -n "$vc" ] &&
    python3 -c "import sys; g, c = map(float, sys.argv[1:]); sys.exit(abs(g - c) > 1e-3 * abs(c))" "$vg" "$vc"; then
    record "eval checkpoint cuda/cpu" ok "val_loss cuda $vg, cpu $vc"
  else
    record "eval checkpoint cuda/cpu" FAIL "val_loss cuda '$vg', cpu '$vc' (logs in $work)"
  fi
  if "${mpirun[@]}" -np 1 "$build/apps/engine/engine" sample --checkpoint "$ckpt" --set device=cuda \
    --tokens 16 >"$work/sample.log" 2>&1; then
    record "sample on cuda" ok "16 tokens"
  else
    record "sample on cuda" FAIL "see $work/sample.log"
  fi
else
  record "eval checkpoint cuda/cpu" FAIL "no checkpoint in $run_dir/ckpt"
fi

# ---- every optimizer family on the GPU against the CPU ------------------------------------------
# 10 steps of each config on synthetic tokens, on cuda and then on cpu. The step-2 train losses
# (after one update) agree to 1e-4 relative. Later steps are printed, not compared: SOAP on these
# configs amplifies rounding differences about 100x per step early on (1 and 2 CPU threads part
# as far by step 3), so only the first update is a test of the device code.
python3 tests/e2e/make_tiny_data.py "$work/tiny" --train-tokens 200000 --val-tokens 4096 \
  --vocab 256 >/dev/null
# family_losses CONFIG DATA_DIR DEVICE: prints the step-2 and step-10 train losses.
family_losses() {
  local dir="$work/family_$(basename "$1" .yaml)_$3"
  "${mpirun[@]}" -np 1 "$build/apps/engine/engine" --config "configs/$1" --set "device=$3" \
    --set "data.train=$2/tiny_train_*.bin" --set "data.val=$2/tiny_val_*.bin" \
    --set "log.dir=$dir" --set checkpoint.every=0 --set checkpoint.at_end=false \
    --set train.steps=10 --set train.eval_every=0 --set train.target_val_loss=0 \
    --set log.every=1 >"$dir.log" 2>&1 &&
    grep -oE '^step:(2|10)/10 train_loss:[0-9.]+' "$dir.log" | cut -d: -f3 | tr '\n' ' '
}
for family in soap.yaml:"$work/data" stacked_soap_moe.yaml:"$work/data" osft_tiny.yaml:"$work/tiny"; do
  cfg=${family%%:*}
  read -r g2 g10 <<<"$(family_losses "$cfg" "${family#*:}" cuda)"
  read -r c2 c10 <<<"$(family_losses "$cfg" "${family#*:}" cpu)"
  if [ -n "${g2:-}" ] && [ -n "${c2:-}" ] &&
    python3 -c "import sys; g, c = map(float, sys.argv[1:]); sys.exit(abs(g - c) > 1e-4 * abs(c))" "$g2" "$c2"; then
    record "train $cfg cuda = cpu" ok "step 2: cuda $g2, cpu $c2 (step 10: $g10, $c10)"
  else
    record "train $cfg cuda = cpu" FAIL "step 2: cuda '${g2:-}', cpu '${c2:-}' (logs $work/family_*)"
  fi
done

# ---- forward + backward throughput --------------------------------------------------------------
if "$build/apps/bench_model/bench_model" --device cuda --json --steps 5 --models gpt2_124m \
  >"$work/bench.json" 2>"$work/bench.err"; then
  record "bench_model --device cuda" ok "$(python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("gpt2_124m B=%d T=%d: %.0f tok/s, %.1f TFLOP/s, MFU %.1f%% of %.1f TFLOP/s f32" % (
    r["batch"], r["seq_len"], r["tokens_per_s"], r["tflops"], 100 * r["mfu"], r["peak_tflops"]))
' "$work/bench.json")"
else
  record "bench_model --device cuda" FAIL "see $work/bench.err"
fi

exit "$failed"
