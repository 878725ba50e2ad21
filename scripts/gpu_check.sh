#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: installs what the project needs, builds with the
# CUDA backend, runs the GPU tests (they must run, not skip), trains a GPT-2 124M-sized model on
# GPU 0 for a few dozen steps on synthetic tokens, evaluates its checkpoint on the GPU and on the
# CPU, samples from it on the GPU, then measures speed side by side with llm.c: the engine's
# whole train step of configs/gpt2_124m.yaml (fp32, and tf32 / bf16 where the build has
# train.precision) and llm.c's train_gpt2cu on the same shards and batch (tokens/s, MFU against
# the bf16 dense peak, peak GPU memory, the engine's phases timed with CUDA events), and
# bench_model --device cuda per op group; prints one summary table and the speed table. Sized
# for at most 10 minutes on one H100 with --prebuilt.
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
  [ "$2" = "ok" ] || [ "$2" = "skip" ] || failed=1
}
summary() {
  echo
  echo "==== gpu_check summary: $gpu_name x $num_gpus, $(($(date +%s) - t_start)) s ===="
  printf '%-26s %-5s %s\n' "check" "state" "detail"
  for r in "${rows[@]}"; do echo "$r"; done
  if [ -f "$work/speed/table.txt" ]; then
    echo
    cat "$work/speed/table.txt"
  fi
}
trap summary EXIT

# ---- install and build --------------------------------------------------------------------------
if [ "$prebuilt" = 1 ]; then
  for b in apps/engine/engine apps/bench_model/bench_model apps/tokenize/tokenize \
    "${gpu_test_binaries[@]}"; do
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

# ---- speed, side by side with llm.c (issue 26) --------------------------------------------------
# GPT-2 124M from a random init, B 8 x T 1024 = 8192 tokens per step (one micro-step) for every
# row, on the same token shards: the Brown corpus (data/brown/text, with the GPT-2 vocabulary in
# data/tokenizer, both from scripts/prepare_data.sh and carried to the GPU machine) tokenized
# here by the engine's tokenize into llm.c's shard format, or synthetic tokens without them.
# Rows: the engine's whole train step of configs/gpt2_124m.yaml at np 1 (its optimizers: AdamW
# + Muon) in fp32, and in tf32 and bf16 where the build has train.precision; llm.c's
# train_gpt2cu (bf16, AdamW) from peers/llmc (a copy of the project's llm.c peer folder, ignored
# by git: README "Running on GPUs").
# Each: tokens/s of the median step after the warm-up, MFU against the GPU's bf16 dense peak
# (the engine's FLOP count, 6 N + 6 L D T per token, for every row), the GPU memory in use at
# its peak (nvidia-smi every 100 ms, less the idle reading) and, for the engine, its phases
# timed with CUDA events (log.device_timing). Then bench_model --device cuda: forward +
# backward, and one step's worth of each op group at the same shapes.
speed="$work/speed"
rm -rf "$speed"
mkdir -p "$speed"
if [ -d data/brown/text ] && [ -f data/tokenizer/encoder.json ] &&
  "$build/apps/tokenize/tokenize" --vocab data/tokenizer --val-fraction 0.1 --json \
    --progress-seconds 0 --output "$speed/brown" data/brown/text >"$speed/tokenize.json" 2>&1; then
  train_glob="$speed/brown_train_*.bin" val_glob="$speed/brown_val_*.bin"
  data_note="Brown corpus, $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens"])' "$speed/tokenize.json") tokens from tokenize"
else
  python3 tests/e2e/make_tiny_data.py "$speed" --train-tokens 2000000 --val-tokens 100000 \
    --vocab 50257 >/dev/null
  train_glob="$speed/tiny_train_*.bin" val_glob="$speed/tiny_val_*.bin"
  data_note="synthetic tokens (no data/brown/text + data/tokenizer in the checkout)"
fi
record "speed data" ok "$data_note"
idle_mib=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1)
# with_peak_mem NAME CMD...: runs CMD with its output in $speed/NAME.log, sampling GPU 0's memory.
with_peak_mem() {
  local name=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 100 \
    >"$speed/$name.mem" 2>/dev/null &
  local smi=$!
  "$@" >"$speed/$name.log" 2>&1
  local rc=$?
  kill "$smi" 2>/dev/null
  wait "$smi" 2>/dev/null
  return $rc
}
speed_steps=40
precisions=(fp32)
if "$build/apps/engine/engine" config-reference 2>/dev/null | grep -q 'train\.precision'; then
  precisions+=(tf32 bf16)
else
  record "engine tf32 / bf16" skip "this build has no train.precision"
fi
for precision in "${precisions[@]}"; do
  psets=()
  [ "$precision" = fp32 ] || psets=(--set "train.precision=$precision")
  if with_peak_mem "engine_$precision" "${mpirun[@]}" -np 1 "$build/apps/engine/engine" \
    --config configs/gpt2_124m.yaml --set device=cuda --set "data.train=$train_glob" \
    --set "data.val=$val_glob" --set "log.dir=$speed/engine_$precision" \
    --set "checkpoint.dir=$speed/engine_$precision/ckpt" --set checkpoint.every=0 \
    --set checkpoint.at_end=false --set train.steps=$speed_steps \
    --set train.batch_tokens=8192 --set train.micro_batch=8 --set train.eval_every=0 \
    --set train.val_tokens=8192 --set train.target_val_loss=0 --set train.warmup_steps=5 \
    --set log.every=10 --set log.device_timing=true --set zero.stage=1 "${psets[@]}"; then
    record "engine $precision 124M speed" ok "$speed_steps steps, see the speed table"
  else
    tail -5 "$speed/engine_$precision.log"
    record "engine $precision 124M speed" FAIL "see $speed/engine_$precision.log"
  fi
done
if [ -x peers/llmc/run_llmc.sh ]; then
  if with_peak_mem llmc bash peers/llmc/run_llmc.sh "$train_glob" "$val_glob" 60 8 1024; then
    record "llm.c 124M speed" ok "60 steps, see the speed table"
  else
    tail -5 "$speed/llmc.log"
    record "llm.c 124M speed" FAIL "see $speed/llmc.log"
  fi
else
  record "llm.c 124M speed" FAIL "no peers/llmc in the checkout (README: Running on GPUs)"
fi
if "$build/apps/bench_model/bench_model" --device cuda --json --steps 5 --models gpt2_124m \
  --op-groups >"$work/bench.json" 2>"$work/bench.err"; then
  record "bench_model --device cuda" ok "$(python3 -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][0]
print("gpt2_124m B=%d T=%d: %.0f tok/s, %.1f TFLOP/s, MFU %.1f%% of %.1f TFLOP/s f32" % (
    r["batch"], r["seq_len"], r["tokens_per_s"], r["tflops"], 100 * r["mfu"], r["peak_tflops"]))
' "$work/bench.json")"
else
  record "bench_model --device cuda" FAIL "see $work/bench.err"
fi
python3 - "$speed" "$gpu_name" "$idle_mib" "$work/bench.json" "${precisions[@]}" \
  >"$speed/table.txt" <<'PY' || record "speed table" FAIL "see $speed/table.txt"
import json, os, re, statistics, sys
speed, gpu, idle, bench, precisions = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5:]
# bf16 dense tensor-core peaks (TFLOP/s) from the data sheets; more specific names first.
peaks = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("H200", 989.4),
         ("GH200", 989.4), ("A100", 312.0), ("L40S", 362.0)]
peak = next((p for name, p in peaks if name in gpu), None)
def peak_mib(name):
    try:
        vals = [float(l) for l in open(os.path.join(speed, name + ".mem")) if l.strip()]
        return "%.0f" % (max(vals) - idle) if vals else "?"
    except OSError:
        return "?"
rows, flops = [], None
for p in precisions:
    path = os.path.join(speed, "engine_" + p, "metrics.jsonl")
    if not os.path.exists(path):
        rows.append(("engine " + p, None, peak_mib("engine_" + p), "no metrics"))
        continue
    recs = [json.loads(l) for l in open(path)]
    recs = [r for r in recs if "step_ms" in r and "device_phase_ms" in r]
    timed = recs[len(recs) // 4:]  # the first quarter is warm-up
    ms = statistics.median(r["step_ms"] for r in timed)
    tok = 8192 / ms * 1e3
    flops = flops or statistics.median(r["gflops"] * 1e9 / r["tokens_per_s"] for r in timed)
    phases = {k: statistics.median(r["device_phase_ms"][k] for r in timed)
              for k in timed[0]["device_phase_ms"]}
    rows.append(("engine " + p, tok, peak_mib("engine_" + p),
                 ", ".join("%s %.1f" % (k, v) for k, v in phases.items())))
llmc = os.path.join(speed, "llmc.log")
if os.path.exists(llmc):
    last = [l for l in open(llmc) if l.startswith("{")]
    rows.append(("llm.c bf16 (AdamW)", json.loads(last[-1])["tokens_per_s"] if last else None,
                 peak_mib("llmc"), "its own step lines in " + llmc))
print("speed, %s: GPT-2 124M, B 8 x T 1024 per step, median step after warm-up; MFU against "
      "the bf16 dense peak (%s TFLOP/s), %.3g FLOP per token" % (gpu, peak, flops or 0))
print("%-20s %10s %7s %12s  %s" % ("run", "tok/s", "MFU", "peak MiB", "device phases (ms)"))
for name, tok, mib, phases in rows:
    mfu = "%.1f%%" % (100 * tok * flops / (peak * 1e12)) if tok and flops and peak else "?"
    print("%-20s %10s %7s %12s  %s" % (name, "%.0f" % tok if tok else "?", mfu, mib, phases))
groups = [json.loads(l) for l in open(bench) if l.startswith("{") and "group" in l] \
    if os.path.exists(bench) else []
if groups:
    print("\nbench_model --device cuda --op-groups: ms per step (device events)")
    for g in groups:
        print("  %-40s %9.2f" % (g["group"], g["ms_per_step"]))
PY
exit "$failed"
