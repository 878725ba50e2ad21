#!/usr/bin/env bash
# The GPU check as one prepared run (issue 35): from a bundle built elsewhere, every GPU path of
# the engine in time-boxed parts, with their logs and one JSON summary written into OUT. Meant
# for a GPU machine lent for minutes, with no package registry: nothing is built or installed.
#
#   scripts/gpu_run.sh OUT (--bundle DIR | --archive FILE.tar.xz) [--rehearse] [--only P,P]
#                      [--budget SECONDS] [--steps N] [--recipe-steps N]
#                      [--llmc BIN] [--llmc-cudnn BIN]
#
#   --bundle DIR       a folder from scripts/bundle.sh (--no-cuda-libs is fine: the CUDA
#                      libraries it lacks are then looked for on the machine)
#   --archive FILE     the same as FILE.tar.xz (bundle.sh --archive); unpacked into a scratch folder
#   --rehearse         run every part on the CPU instead (device=cpu, small shapes, two steps where
#                      a part trains long): the command lines, the bundle and the summary are
#                      checked on a machine with no GPU; llm.c's command lines printed, not run
#   --only P,P         the parts to run (default: all, in this order): gpu tests speed recipe ranks
#                      resume families refresh soap ops
#   --budget SECONDS   the whole run's time (default 420): each part gets its own box, cut to what
#                      is left; a part with under 15 s left is not started
#   --recipe-steps N   steps of the record recipe's run (default 100)
#   --steps N          steps of each 124M speed run (default 60, the Muon run at most 40; the first
#                      quarter is warm-up)
#   --llmc BIN         llm.c's train_gpt2cu, its default build (default: peers/llmc/train_gpt2cu
#                      when it is there), run beside the engine in the speed part
#   --llmc-cudnn BIN   llm.c's USE_CUDNN=1 build (default: peers/llmc/train_gpt2cu_cudnn)
#
# Run from the repository root (configs/, scripts/, tests/e2e/ are read from it). Optional beside
# it: data/brown/text + data/tokenizer (scripts/prepare_data.sh; the speed rows then train on the
# Brown corpus tokenized there by the bundle's tokenize, else on synthetic tokens), the llm.c
# binaries (built in the session into the git-ignored peers/, never committed) and peers/emopt (a
# checkout of NVIDIA-NeMo/Emerging-Optimizers: the SOAP/REKLS reference, on the machine's python3
# PyTorch).
#
# OUT gets summary.json (every part: state ok / FAIL / timeout / skip, seconds, detail, and its
# numbers), summary.txt (the same as tables) and logs.tar.gz (every log and metrics file).
# Exits 0 when no part failed or timed out.
set -uo pipefail
export GTEST_COLOR=no PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
cd "$(dirname "$0")/.."
repo=$(pwd)
all_parts="gpu tests speed recipe ranks resume families refresh soap ops"

usage() { sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; }
out="" bundle="" archive="" rehearse=0 only="$all_parts" budget=420 steps=60 recipe_steps=100
llmc_bin="" llmc_cudnn_bin=""
[ -x peers/llmc/train_gpt2cu ] && llmc_bin=$repo/peers/llmc/train_gpt2cu
[ -x peers/llmc/train_gpt2cu_cudnn ] && llmc_cudnn_bin=$repo/peers/llmc/train_gpt2cu_cudnn
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle="$2"; shift 2 ;;
    --archive) archive="$2"; shift 2 ;;
    --rehearse) rehearse=1; shift ;;
    --only) only="${2//,/ }"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --recipe-steps) recipe_steps="$2"; shift 2 ;;
    --llmc) llmc_bin="$2"; shift 2 ;;
    --llmc-cudnn) llmc_cudnn_bin="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "gpu_run: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "gpu_run: one OUT folder, got '$out' and '$1'" >&2; exit 2; }
       out="$1"; shift ;;
  esac
done
[ -n "$out" ] || { usage >&2; exit 2; }
for b in llmc_bin llmc_cudnn_bin; do  # absolute: llm.c runs in its own scratch folder
  if [ -n "${!b}" ]; then
    [ -x "${!b}" ] || { echo "gpu_run: '${!b}' is not an executable (--$(echo ${b%_bin} | tr _ -))" >&2; exit 2; }
    printf -v "$b" '%s' "$(realpath "${!b}")"
  fi
done
for p in $only; do
  [[ " $all_parts " == *" $p "* ]] || { echo "gpu_run: unknown part '$p' (parts: $all_parts)" >&2; exit 2; }
done
mkdir -p "$out" && out=$(cd "$out" && pwd)
t_start=$(date +%s)
# The unpacked bundle and the work folder are scratch (the work folder's logs go into
# OUT/logs.tar.gz): removed however the run ends.
scratch="" work=""
trap 'rm -rf "$scratch" "$work"' EXIT

# ---- the bundle ----------------------------------------------------------------------------
if [ -n "$archive" ]; then
  [ -f "$archive" ] || { echo "gpu_run: no archive '$archive'" >&2; exit 2; }
  scratch=$(mktemp -d /tmp/gpu_run.XXXXXX)
  tar -xJf "$archive" -C "$scratch" || { echo "gpu_run: could not unpack '$archive'" >&2; exit 2; }
  bundle=$(find "$scratch" -mindepth 2 -maxdepth 2 -name env.sh -printf '%h\n' | head -1)
fi
[ -n "$bundle" ] && [ -f "$bundle/env.sh" ] ||
  { echo "gpu_run: give --bundle DIR or --archive FILE (a scripts/bundle.sh output; '$bundle' has no env.sh)" >&2; exit 2; }
bundle=$(cd "$bundle" && pwd)
# shellcheck disable=SC1091
source "$bundle/env.sh"
# The test executables read fixtures under the source folder they were built from (compiled in):
# where that folder is missing here, it becomes a link to this checkout.
src_dir=$(cat "$bundle/build_source_dir" 2>/dev/null)
if [ -n "$src_dir" ] && [ ! -e "$src_dir" ]; then
  mkdir -p "$(dirname "$src_dir")" && ln -s "$repo" "$src_dir" && echo "gpu_run: linked $src_dir -> $repo"
fi
work=$(mktemp -d /tmp/gpu_run_work.XXXXXX)
mkdir -p "$work/parts"
engine="$bundle/apps/engine/engine"
mpirun=(mpirun --oversubscribe --allow-run-as-root --bind-to none)
if [ "$rehearse" = 1 ]; then
  device=cpu
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
  device=cuda
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}  # per rank; up to 4 ranks share the cores
fi

# The CUDA libraries a --no-cuda-libs bundle lacks: found where this machine keeps them (the
# toolkit's folders, or the NVIDIA wheels of its Python), put on LD_LIBRARY_PATH.
missing=$(ldd "$engine" 2>/dev/null | awk '/not found/ {print $1}' | sort -u)
found_dirs=""
for name in $missing; do
  dir=$(find /usr/local/cuda*/ /usr/lib /opt /usr/local/lib -name "$name" \( -type f -o -type l \) \
    2>/dev/null | head -1 | xargs -r dirname)
  [ -n "$dir" ] && [[ ":$found_dirs:" != *":$dir:"* ]] && found_dirs="${found_dirs:+$found_dirs:}$dir"
done
[ -n "$found_dirs" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$found_dirs"
still_missing=$(ldd "$engine" 2>/dev/null | awk '/not found/ {print $1}' | sort -u | paste -sd' ')

# ---- parts: each in its own process group under timeout, with a JSON record -----------------
# record NAME STATE DETAIL [JSON]: writes parts/NAME.json (JSON: the part's numbers, an object).
record() {
  local extra=${4:-}
  python3 - "$work/parts/$1.json" "$1" "$2" "$3" "${extra:-"{}"}" <<'PY'
import json, sys
path, name, state, detail, extra = sys.argv[1:6]
json.dump({"part": name, "state": state, "detail": detail, "data": json.loads(extra)}, open(path, "w"))
PY
}
box_of() {
  case "$1" in
    gpu) echo 20 ;; tests) echo 150 ;; speed) echo 240 ;; recipe) echo 120 ;; ranks) echo 150 ;;
    resume) echo 60 ;;
    families) echo 90 ;; refresh) echo 120 ;; soap) echo 120 ;; ops) echo 60 ;;
  esac
}

# ---- part gpu: the device, its driver, the libraries ---------------------------------------
part_gpu() {
  local libs="bundle ${bundle}${found_dirs:+; CUDA libraries from $found_dirs}"
  if [ -n "$still_missing" ]; then
    record gpu FAIL "engine cannot load: $still_missing ($libs)"
    return 1
  fi
  if [ "$rehearse" = 1 ]; then
    record gpu ok "rehearsal on the CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $libs" \
      "{\"gpu\": \"none (rehearsal)\"}"
    return 0
  fi
  local q
  q=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader -i 0) ||
    { record gpu FAIL "nvidia-smi: no GPU"; return 1; }
  nvidia-smi >"$work/nvidia-smi.txt" 2>&1
  record gpu ok "$q; $libs" "$(python3 -c 'import json,sys; n,d,m,c=[s.strip() for s in sys.argv[1].split(",")]; print(json.dumps({"gpu":n,"driver":d,"memory":m,"max_sm_clock":c}))' "$q")"
}

# ---- part tests: the CUDA test binaries, which must run, not skip --------------------------
part_tests() {
  # Skips that are right on one GPU: the no-device check, the tests that need two GPUs.
  local expected='CudaAvailability\.NoDeviceMeansAClearError|GpuTraining\.ZeroStagesOverNcclEqualTheCpu'
  local b name log rc passed skipped state=ok detail="" json="{"
  for b in tests/core/cuda_backend_tests tests/optim/optim_ops_cuda_tests \
    tests/optim/optim_device_replay_tests tests/optim/osft_device_replay_tests \
    tests/comm/comm_nccl_tests tests/engine/engine_gpu_training_tests; do
    name=$(basename "$b")
    log="$work/$name.log"
    if [ ! -x "$bundle/$b" ]; then
      detail+="$name: not in the bundle; "
      json+="\"$name\": {\"missing\": true},"
      [ "$rehearse" = 1 ] || state=FAIL
      continue
    fi
    local t0=$SECONDS
    timeout -k 5 90 "${mpirun[@]}" -np 1 "$bundle/$b" >"$log" 2>&1
    rc=$?
    passed=$(grep -cE '^\[       OK \]' "$log")
    skipped=$(grep -E '^\[  SKIPPED \] [A-Za-z0-9_]+\.[A-Za-z0-9_]+' "$log" | grep -vcE "$expected")
    local failed_names
    failed_names=$(grep -E '^\[  FAILED  \] [A-Za-z0-9_]+\.' "$log" | awk '{print $4}' | sort -u | paste -sd' ')
    detail+="$name: $passed ok, $skipped skipped, exit $rc, $((SECONDS - t0)) s${failed_names:+ (failed: $failed_names)}; "
    json+="\"$name\": {\"passed\": $passed, \"skipped\": $skipped, \"exit\": $rc, \"failed\": \"$failed_names\"},"
    if [ "$rc" -ne 0 ] || { [ "$rehearse" = 0 ] && [ "$skipped" -ne 0 ]; }; then state=FAIL; fi
  done
  # With two GPUs or more: NCCL across ranks, and the ZeRO stages over NCCL against the CPU.
  local gpus=0
  [ "$rehearse" = 0 ] && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [ "$gpus" -ge 2 ]; then
    for b in tests/comm/comm_nccl_tests tests/engine/engine_gpu_training_tests; do
      name=$(basename "$b")_np2
      timeout -k 5 90 "${mpirun[@]}" -np 2 "$bundle/$b" >"$work/$name.log" 2>&1
      rc=$?
      passed=$(grep -cE '^\[       OK \]' "$work/$name.log")
      detail+="$name: $passed ok, exit $rc; "
      json+="\"$name\": {\"passed\": $passed, \"exit\": $rc},"
      [ "$rc" -eq 0 ] || state=FAIL
    done
  fi
  json="${json%,}}"
  record tests "$state" "$detail" "$json"
  [ "$state" = ok ]
}

# ---- part speed: GPT-2 124M, fp32 / tf32 / bf16, beside llm.c ------------------------------
# B 8 x T 1024 = 8192 tokens a step, one micro-step, np 1, from a random init, on the same
# shards; the engine's step phases timed with CUDA events (log.device_timing), its peak memory
# from its own allocator; llm.c's from nvidia-smi sampled every 100 ms less the idle reading.
part_speed() {
  local dir="$work/speed" small=() run_steps=$steps
  mkdir -p "$dir"
  if [ "$rehearse" = 1 ]; then
    # One micro-step of 8 rows of 64: the command lines are what a rehearsal checks, and 8192
    # tokens a step through the 50257-wide head took 4.4 s a step on one core.
    small=(--set model.n_layer=1 --set model.d_model=64 --set model.n_head=2 --set model.seq_len=64
      --set train.batch_tokens=512 --set train.val_tokens=512)
    run_steps=2
  fi
  local data_note
  if [ -d data/brown/text ] && [ -f data/tokenizer/encoder.json ] &&
    timeout 60 "$bundle/apps/tokenize/tokenize" --vocab data/tokenizer --val-fraction 0.1 --json \
      --progress-seconds 0 --output "$dir/brown" data/brown/text >"$dir/tokenize.json" 2>"$dir/tokenize.err"; then
    train_glob="$dir/brown_train_*.bin" val_glob="$dir/brown_val_*.bin"
    data_note="Brown corpus, $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens"])' "$dir/tokenize.json") tokens"
  else
    python3 tests/e2e/make_tiny_data.py "$dir" --train-tokens 2000000 --val-tokens 100000 --vocab 50257 >/dev/null
    train_glob="$dir/tiny_train_*.bin" val_glob="$dir/tiny_val_*.bin"
    data_note="synthetic tokens"
  fi
  # llm.c's optimizer (AdamW, lr 6e-4, betas 0.9/0.95, no weight decay) for the side by side;
  # then bf16 with the config's own AdamW + Muon, whose optimizer phase is Muon's Newton-Schulz
  # (its lr is tuned for 524288-token steps: at 8192 the loss may climb, so no divergence stop).
  local adamw="optim=[{params: ['*'], optimizer: adamw, lr: 0.0006, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.0}]"
  local run p rc states=""
  # The Muon row again with its orthogonaliser in f32 (the preset's is the record's bf16); the bf16
  # row again on the kernels each newer path replaced (its fallbacks, chosen by environment):
  # unfused GEMM epilogues, attention through f32 and rounding passes, the two-pass classifier;
  # with only the bf16 residual add unfused (equal to the bf16 row's time where cuBLASLt
  # refuses the fused bf16 C + bias, which no test can tell); and with attention's tensor-core
  # products on TF32 operands instead of bf16 ones.
  local earlier=(ENGINE_CUDA_GEMM_EPILOGUE=0 ENGINE_CUDA_ATTENTION_BF16_VIA_F32=1
    ENGINE_CUDA_CLASSIFIER_TWO_PASS=1)
  for run in fp32 tf32 bf16 bf16_earlier bf16_resaddunfused bf16_atttf32 bf16_muon bf16_muon_nsf32; do
    p=${run%%_*}
    local envs=()
    [ "$run" = bf16_earlier ] && envs=("${earlier[@]}")
    [ "$run" = bf16_resaddunfused ] && envs=(ENGINE_CUDA_GEMM_EPILOGUE_BF16_C=0)
    [ "$run" = bf16_atttf32 ] && envs=(ENGINE_CUDA_ATTENTION_BF16_ON_TF32=1)
    local opt=(--set "$adamw" --set train.steps=$run_steps)
    [[ "$run" == bf16_muon* ]] &&
      opt=(--set train.diverge_loss_factor=0 --set train.steps=$((run_steps < 40 ? run_steps : 40)))
    [ "$run" = bf16_muon_nsf32 ] && opt+=(--set optim.0.ns_bf16=false)
    env "${envs[@]}" timeout -k 5 100 "${mpirun[@]}" -np 1 "$engine" --config configs/gpt2_124m.yaml \
      --set device=$device --set "data.train=$train_glob" --set "data.val=$val_glob" \
      --set "log.dir=$dir/engine_$run" --set checkpoint.every=0 --set checkpoint.at_end=false \
      --set train.batch_tokens=8192 --set train.micro_batch=8 \
      --set train.eval_every=0 --set train.val_tokens=8192 --set train.target_val_loss=0 \
      --set train.warmup_steps=5 --set log.every=10 --set log.device_timing=true \
      --set zero.stage=1 --set train.precision=$p "${opt[@]}" "${small[@]}" >"$dir/engine_$run.log" 2>&1
    rc=$?
    states+="$run exit $rc; "
  done
  # llm.c's two builds (the peer binaries given by --llmc and --llmc-cudnn), each from a random
  # init (-e d12) on the same shards and batch: B 8 x T 1024, one micro-step, AdamW lr 6e-4, no
  # validation, sampling or HellaSwag; 60 steps. Its step lines carry the step's ms.
  local name bin
  for name in llmc llmc_cudnn; do
    bin=$llmc_bin
    [ "$name" = llmc_cudnn ] && bin=$llmc_cudnn_bin
    if [ -z "$bin" ]; then
      states+="$name: no binary; "
      continue
    fi
    local cmd=("$bin" -i "$train_glob" -j "$val_glob" -e d12 -b 8 -t 1024 -d 8192 -x 60 -l 0.0006
      -u 0 -c 0.0 -v 0 -s 0 -h 0)
    if [ "$rehearse" = 1 ]; then
      states+="$name: would run ${cmd[*]}; "
      continue
    fi
    local idle smi
    idle=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1)
    echo "$idle" >"$dir/$name.idle"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 100 >"$dir/$name.mem" 2>/dev/null &
    smi=$!
    (cd "$dir" && timeout -k 5 90 "${cmd[@]}") >"$dir/$name.log" 2>&1
    rc=$?
    kill "$smi" 2>/dev/null
    states+="$name exit $rc; "
  done
  python3 - "$dir" "$work/parts/speed.json" "$data_note" "$states" "$rehearse" <<'PY'
import json, os, statistics, sys
sys.path.insert(0, "scripts")  # the checkout's root is the working folder
import runlog
d, path, data_note, states, rehearse = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1"
gpu = "rehearsal"
try:
    gpu = json.load(open(os.path.join(os.path.dirname(path), "gpu.json")))["data"]["gpu"]
except Exception:
    pass
# bf16 dense tensor-core peaks (TFLOP/s) from the data sheets; more specific names first.
peaks = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("H200", 989.4),
         ("GH200", 989.4), ("A100", 312.0), ("L40S", 362.0)]
peak = next((p for name, p in peaks if name in gpu), None)
rows, flops_per_token, ok = [], None, True
losses = {}
names = {"fp32": "engine fp32", "tf32": "engine tf32", "bf16": "engine bf16",
         "bf16_earlier": "engine bf16, earlier kernels",
         "bf16_resaddunfused": "engine bf16, residual add unfused",
         "bf16_atttf32": "engine bf16, attention on TF32 operands",
         "bf16_muon": "engine bf16 Muon", "bf16_muon_nsf32": "engine bf16 Muon ns f32"}
for p in names:
    recs = runlog.step_rows(os.path.join(d, "engine_" + p, "metrics.jsonl"))
    if not recs:
        rows.append({"run": names[p], "error": "no metrics"}); ok = False
        continue
    ms, phases, timed = runlog.steady_state(recs)
    fpt = statistics.median(r["gflops"] * 1e9 / r["tokens_per_s"] for r in timed if r["tokens_per_s"] > 0)
    flops_per_token = flops_per_token or fpt  # the same model in every row
    step_tokens = recs[-1]["tokens"] / recs[-1]["step"]  # 8192; the rehearsal's 512
    row = {"run": names[p], "steps": recs[-1]["step"], "ms_per_step": round(ms, 2),
           "tokens_per_s": round(step_tokens / ms * 1e3), "flop_per_token": fpt}
    if phases:
        row["device_phase_ms"] = phases
        # The host's time to issue forward and backward (no read back inside them): well under
        # the device's, the host runs ahead and a CUDA graph of them would save no time; near
        # it, the step waits on its launches (issue 46 item 7 decides on this).
        row["host_issue_fb_ms"] = round(statistics.median(
            r["phase_ms"]["forward_backward"] for r in timed), 2)
    if "peak_mem_bytes" in recs[-1]:
        row["peak_mib"] = round(recs[-1]["peak_mem_bytes"] / 2**20)
    last = recs[-10:]
    losses[p] = sum(r["train_loss"] for r in last) / len(last)
    row["train_loss_last10"] = round(losses[p], 4)
    rows.append(row)
# llm.c's step lines: "step   12/60 | loss ... | 24.80 ms | ... | 330000 tok/s"; the median ms
# past the first quarter of its steps, as the engine's steady state.
import re
peer_names = {"llmc": "llm.c bf16 (AdamW)", "llmc_cudnn": "llm.c cuDNN bf16 (AdamW)"}
for key, label in peer_names.items():
    log = os.path.join(d, key + ".log")
    if not os.path.exists(log):
        continue
    row = {"run": label}
    steps_ms = [(int(m.group(1)), float(m.group(2))) for m in
                (re.match(r"step\s+(\d+)/\d+ \|.*\| ([0-9.]+) ms \|", l) for l in open(log, errors="replace")) if m]
    if steps_ms:
        last = steps_ms[-1][0]
        ms = statistics.median(t for s, t in steps_ms if s > last // 4)
        row.update(steps=last, ms_per_step=round(ms, 2), tokens_per_s=round(8192 / ms * 1e3))
    else:
        row["error"] = "no step lines"; ok = False
    try:
        idle = float(open(os.path.join(d, key + ".idle")).read())
        vals = [float(l) for l in open(os.path.join(d, key + ".mem")) if l.strip()]
        row["peak_mib"] = round(max(vals) - idle)
    except Exception:
        pass
    rows.append(row)
for r in rows:
    if peak and flops_per_token and "tokens_per_s" in r:
        r["mfu_bf16_peak"] = round(r["tokens_per_s"] * flops_per_token / (peak * 1e12), 4)
eng = {r["run"]: r for r in rows}
ratios = {}
for label in peer_names.values():
    if "tokens_per_s" not in eng.get(label, {}):
        continue
    for name in names.values():
        if "tokens_per_s" in eng.get(name, {}):
            ratios["%s / %s" % (name, label)] = round(eng[name]["tokens_per_s"] / eng[label]["tokens_per_s"], 3)
for other in ("engine bf16, residual add unfused", "engine bf16, earlier kernels",
              "engine bf16, attention on TF32 operands"):
    if "tokens_per_s" in eng.get("engine bf16", {}) and "tokens_per_s" in eng.get(other, {}):
        ratios["engine bf16 / " + other] = round(
            eng["engine bf16"]["tokens_per_s"] / eng[other]["tokens_per_s"], 3)
if "bf16" in losses and "fp32" in losses:
    ratios["bf16 loss / fp32 loss - 1 (mean of the last 10 steps)"] = round(losses["bf16"] / losses["fp32"] - 1, 5)
state = "ok" if ok else "FAIL"
detail = "%s; %s" % (data_note, states) + "; ".join(
    "%s %s tok/s" % (r["run"], r.get("tokens_per_s", "?")) for r in rows)
json.dump({"part": "speed", "state": state, "detail": detail,
           "data": {"gpu": gpu, "peak_tflops_bf16": peak, "batch": "8 x 1024", "rows": rows,
                    "ratios": ratios}}, open(path, "w"))
sys.exit(0 if ok else 1)
PY
}

# ---- part recipe: the record recipe (configs/speedrun_gpu.yaml) on the one GPU -------------------
# One rank's share of the 8-GPU batch (one sequence of 49152 tokens a step), the record's keys as
# written, on the speed part's shards (tokenized there, or synthetic); --recipe-steps steps; then
# the 8 x H100 projection from its phases (scripts/project_record.py, docs/record_recipe.md).
part_recipe() {
  local dir="$work/recipe" small=() run_steps=$recipe_steps
  mkdir -p "$dir"
  if [ "$rehearse" = 1 ]; then
    small=(--set model.d_model=64 --set model.n_head=2 --set model.seq_len=256)
    run_steps=2
  fi
  local train_glob="$work/speed/brown_train_*.bin" val_glob="$work/speed/brown_val_*.bin"
  if ! compgen -G "$train_glob" >/dev/null; then
    python3 tests/e2e/make_tiny_data.py "$dir" --train-tokens 4000000 --val-tokens 200000 --vocab 50257 >/dev/null
    train_glob="$dir/tiny_train_*.bin" val_glob="$dir/tiny_val_*.bin"
  fi
  local seq=49152
  [ "$rehearse" = 1 ] && seq=256
  timeout -k 5 110 "${mpirun[@]}" -np 1 "$engine" --config configs/speedrun_gpu.yaml \
    --set device=$device --set "data.train=$train_glob" --set "data.val=$val_glob" \
    --set "log.dir=$dir/run" --set train.steps=$run_steps --set train.batch_tokens=$seq \
    --set train.eval_every=0 --set train.val_tokens=$seq --set train.target_val_loss=0 \
    --set train.warmup_steps=3 --set log.device_timing=true "${small[@]}" >"$dir/run.log" 2>&1
  local rc=$?
  python3 - "$dir/run/metrics.jsonl" "$work/parts/recipe.json" "$rc" <<'PY'
import json, os, statistics, sys
sys.path.insert(0, "scripts")  # the checkout's root is the working folder
import runlog
path, out, rc = sys.argv[1], sys.argv[2], sys.argv[3]
recs = runlog.step_rows(path)
data = {}
if recs:
    ms, phases, timed = runlog.steady_state(recs)
    data = {"steps": recs[-1]["step"], "ms_per_step": round(ms, 2),
            "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in timed)),
            "first_loss": recs[0]["train_loss"], "last_loss": recs[-1]["train_loss"],
            "peak_mib": round(recs[-1].get("peak_mem_bytes", 0) / 2**20)}
    if phases:
        data["device_phase_ms"] = phases
ok = rc == "0" and bool(recs)
detail = ("speedrun_gpu.yaml, np 1, one 49152-token sequence a step: %s steps, %s ms/step, %s tok/s, loss %.4f -> %.4f, peak %s MiB"
          % (data["steps"], data["ms_per_step"], data["tokens_per_s"], data["first_loss"], data["last_loss"], data["peak_mib"])
          if recs else "exit %s, no metrics (recipe/run.log)" % rc)
if ok:
    import subprocess
    p = subprocess.run([sys.executable, "scripts/project_record.py", "gpu", "--one-gpu",
                        os.path.dirname(path), "--json"], capture_output=True, text=True)
    if p.returncode == 0:
        data["projection"] = json.loads(p.stdout)
        detail += "; projected 8 x H100: %s ms/step, %s min (record 2.966)" % (
            data["projection"]["step_ms"], data["projection"]["minutes"])
    else:
        detail += "; projection failed: " + (p.stderr.strip() or p.stdout.strip())[-200:]
json.dump({"part": "recipe", "state": "ok" if ok else "FAIL", "detail": detail, "data": data}, open(out, "w"))
sys.exit(0 if ok else 1)
PY
}

# ---- part ranks: np 2 and 4 on the one GPU (comm.device_collectives: mpi), ZeRO 1-3 ----------
# The tiny config, 20 steps, against np 1 on the same device: the bar of the CPU world-size
# tests (tests/e2e/e2e.py: losses 3e-7, global grad norm 1e-6, relative).
tiny_run() {  # tiny_run NAME NP CONFIG DEVICE [--set ...]
  local name=$1 np=$2 cfg=$3 dev=$4; shift 4
  timeout -k 5 60 "${mpirun[@]}" -np "$np" "$engine" --config "configs/$cfg" \
    --set device="$dev" --set comm.device_collectives=mpi \
    --set "data.train=$work/tiny_data/tiny_train_*.bin" --set "data.val=$work/tiny_data/tiny_val_*.bin" \
    --set "log.dir=$work/ranks/$name" --set "checkpoint.dir=$work/ranks/$name/ckpt" \
    --set checkpoint.overwrite=true --set train.steps=20 --set checkpoint.every=10 "$@" \
    >"$work/ranks/$name.log" 2>&1
}
compare_runs() {  # compare_runs A B FIRST LOSS_BAR NORM_BAR: prints one JSON object, exit 1 over a bar
  python3 - "$work/ranks/$1/metrics.jsonl" "$work/ranks/$2/metrics.jsonl" "$3" "$4" "$5" <<'PY'
import json, sys
def rows(path):
    try:
        return {r["step"]: r for r in map(json.loads, open(path)) if r.get("train_loss") is not None}
    except OSError:
        return {}
a, b, first, lbar, nbar = rows(sys.argv[1]), rows(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
steps = [s for s in sorted(b) if s >= first and s in a]
if not steps or len(steps) < len([s for s in b if s >= first]):
    print(json.dumps({"error": "missing steps"})); sys.exit(1)
rel = lambda x, y: abs(x - y) / max(abs(y), 1e-30)
loss = max(rel(a[s]["train_loss"], b[s]["train_loss"]) for s in steps)
norm = max(rel(a[s]["grad_norm"], b[s]["grad_norm"]) for s in steps if s >= max(first, 1))
print(json.dumps({"steps": len(steps), "worst_loss_rel": loss, "worst_grad_norm_rel": norm}))
sys.exit(0 if loss <= lbar and norm <= nbar else 1)
PY
}
part_ranks() {
  mkdir -p "$work/ranks"
  python3 tests/e2e/make_tiny_data.py "$work/tiny_data" >/dev/null
  local state=ok detail="" json="{" np stage r
  tiny_run np1 1 tiny.yaml "$device" || { record ranks FAIL "np 1 did not run (ranks/np1.log)"; return 1; }
  for np in 2 4; do
    for stage in 1 2 3; do
      if tiny_run "np${np}_stage$stage" "$np" tiny.yaml "$device" --set zero.stage=$stage; then
        r=$(compare_runs "np${np}_stage$stage" np1 0 3e-7 1e-6) || state=FAIL
      else
        r='{"error": "run failed"}'; state=FAIL
      fi
      detail+="np $np ZeRO $stage: $r; "
      json+="\"np${np}_stage$stage\": $r,"
    done
  done
  record ranks "$state" "$detail" "${json%,}}"
  [ "$state" = ok ]
}

# ---- part resume: the GPU run's checkpoint on the CPU; eval and sample on the GPU -----------
part_resume() {
  [ -d "$work/ranks/np2_stage3/ckpt" ] ||
    { record resume skip "no np 2 ZeRO 3 checkpoint (part ranks did not run)"; return 0; }
  local state=ok detail="" r ckpt="$work/ranks/np2_stage3/ckpt/step_00000010"
  if tiny_run resumed_cpu 4 tiny.yaml cpu --set zero.stage=3 --set "checkpoint.resume=$ckpt"; then
    # GPU against CPU arithmetic: 1e-4 relative, as scripts/gpu_check.sh.
    r=$(compare_runs resumed_cpu np2_stage3 11 1e-4 1e-3) || state=FAIL
  else
    r='{"error": "resume on the cpu failed"}'; state=FAIL
  fi
  detail+="GPU np 2 ZeRO 3 step 10 -> CPU np 4, steps 11-20: $r; "
  local final="$work/ranks/np2_stage3/ckpt/step_00000020" vg vc
  timeout 40 "${mpirun[@]}" -np 1 "$engine" eval --checkpoint "$final" --set device=$device \
    --set "data.val=$work/tiny_data/tiny_val_*.bin" >"$work/ranks/eval_dev.log" 2>&1
  timeout 40 "${mpirun[@]}" -np 1 "$engine" eval --checkpoint "$final" --set device=cpu \
    --set "data.val=$work/tiny_data/tiny_val_*.bin" >"$work/ranks/eval_cpu.log" 2>&1
  vg=$(grep -oE 'val_loss:[0-9.]+' "$work/ranks/eval_dev.log" | head -1 | cut -d: -f2)
  vc=$(grep -oE 'val_loss:[0-9.]+' "$work/ranks/eval_cpu.log" | head -1 | cut -d: -f2)
  if [ -n "$vg" ] && [ -n "$vc" ] &&
    python3 -c "import sys; g, c = map(float, sys.argv[1:]); sys.exit(abs(g - c) > 1e-4 * abs(c))" "$vg" "$vc"; then
    detail+="eval $device $vg, cpu $vc; "
  else
    detail+="eval $device '$vg', cpu '$vc' (ranks/eval_*.log); "; state=FAIL
  fi
  if timeout 40 "${mpirun[@]}" -np 1 "$engine" sample --checkpoint "$final" --set device=$device \
    --tokens 16 >"$work/ranks/sample.log" 2>&1; then
    detail+="sample on $device: 16 tokens"
  else
    detail+="sample on $device failed (ranks/sample.log)"; state=FAIL
  fi
  record resume "$state" "$detail" "{\"resume\": $r, \"eval_device\": \"$vg\", \"eval_cpu\": \"$vc\"}"
  [ "$state" = ok ]
}

# ---- part families: SOAP, StackedSoap (MoE) and OSFT, one update on the GPU against the CPU --
# The step-2 train loss (after one update) within 1e-4 relative; later steps are printed, not
# compared (SOAP amplifies rounding differences about 100x a step early on).
part_families() {
  mkdir -p "$work/families"
  python3 tests/e2e/make_tiny_data.py "$work/families/v50k" --train-tokens 200000 --val-tokens 20000 \
    --vocab 50257 >/dev/null
  python3 tests/e2e/make_tiny_data.py "$work/families/v256" --train-tokens 200000 --val-tokens 4096 >/dev/null
  local state=ok detail="" json="{" fam cfg data g c fam_steps=10
  [ "$rehearse" = 1 ] && fam_steps=2
  for fam in soap.yaml:v50k stacked_soap_moe.yaml:v50k osft_tiny.yaml:v256; do
    cfg=${fam%%:*} data="$work/families/${fam#*:}"
    local side losses=() small=()
    # Rehearsal: the SOAP configs' steps in one micro-step of 8 rows (their batch is two).
    [ "$rehearse" = 1 ] && [ "${fam#*:}" = v50k ] &&
      small=(--set train.batch_tokens=1024 --set train.val_tokens=1024 --set train.warmup_steps=0)
    for side in device cpu; do  # the device run, then the same on the CPU
      local dir="$work/families/$(basename "$cfg" .yaml)_$side" dev=$device
      [ "$side" = cpu ] && dev=cpu
      timeout -k 5 40 "${mpirun[@]}" -np 1 "$engine" --config "configs/$cfg" --set "device=$dev" \
        --set "data.train=$data/tiny_train_*.bin" --set "data.val=$data/tiny_val_*.bin" \
        --set "log.dir=$dir" --set checkpoint.every=0 --set checkpoint.at_end=false \
        --set train.steps=$fam_steps --set train.eval_every=0 --set train.target_val_loss=0 \
        --set log.every=1 "${small[@]}" >"$dir.log" 2>&1
      losses+=("$(python3 -c 'import json,sys; print(next((r["train_loss"] for r in map(json.loads, open(sys.argv[1])) if r["step"] == 2), ""))' \
        "$dir/metrics.jsonl" 2>/dev/null)")
    done
    g=${losses[0]} c=${losses[1]}
    if [ -n "$g" ] && [ -n "$c" ] &&
      python3 -c "import sys; g, c = map(float, sys.argv[1:]); sys.exit(abs(g - c) > 1e-4 * abs(c))" "$g" "$c"; then
      detail+="$cfg step 2: $device $g, cpu $c; "
    else
      detail+="$cfg step 2: $device '$g', cpu '$c' (FAIL); "; state=FAIL
    fi
    json+="\"$cfg\": {\"device\": \"$g\", \"cpu\": \"$c\"},"
  done
  record families "$state" "$detail" "${json%,}}"
  [ "$state" = ok ]
}

# ---- part refresh: the batched eigenbasis refresh against one at a time ---------------------
# bench_optim's refresh rows on GPT-2 124M's hidden matrices (D 768, 12 layers; rehearsal: D 64, 2):
# the four the issue asks for, each timed once after one warm-up. All nine rows with two repeats
# ran about 21 passes of 96 eighs up to 3072 wide, past the part's box (run 3 wrote none).
shape() { if [ "$rehearse" = 1 ]; then echo "--d-model 64 --layers 2"; else echo "--d-model 768 --layers 12"; fi; }
part_refresh() {
  mkdir -p "$work/optim"
  local rows="refresh eigh batched,refresh eigh one at a time,refresh qr batched,refresh qr one at a time"
  # shellcheck disable=SC2046
  timeout -k 5 110 "${mpirun[@]}" -np 1 "$bundle/apps/bench_optim/bench_optim" --device $device \
    $(shape) --repeat 1 --only "$rows" --json >"$work/optim/refresh.jsonl" 2>"$work/optim/refresh.err"
  local rc=$?
  python3 - "$work/optim/refresh.jsonl" "$work/parts/refresh.json" "$rc" "$work/optim/refresh.err" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ms = {r["what"]: r["ms"] for r in rows if r["part"] == "refresh"}
ratios = {k: round(ms[k + " one at a time"] / ms[k + " batched"], 2)
          for k in ("eigh", "qr") if ms.get(k + " batched") and k + " one at a time" in ms}
ok = sys.argv[3] == "0" and len(ratios) == 2
detail = "; ".join("%s %.1f ms" % kv for kv in ms.items()) + "; one at a time / batched: %s" % ratios
if not ok:  # what bench_optim said last (runs 2 and 3 failed here with nothing to go on)
    said = [l.strip() for l in open(sys.argv[4], errors="replace") if l.strip()]
    detail += "; exit %s: %s" % (sys.argv[3], said[-1][:300] if said else "no message")
json.dump({"part": "refresh", "state": "ok" if ok else "FAIL", "detail": detail,
           "data": {"ms": ms, "one_at_a_time_over_batched": ratios}}, open(sys.argv[2], "w"))
sys.exit(0 if ok else 1)
PY
}

# ---- part soap: the SOAP / REKLS step against the reference on the same device --------------
part_soap() {
  mkdir -p "$work/optim"
  local emopt="$repo/peers/emopt"
  if [ ! -d "$emopt/emerging_optimizers" ]; then
    record soap skip "no peers/emopt (a checkout of NVIDIA-NeMo/Emerging-Optimizers)"; return 0
  fi
  local py=python3
  [ "$rehearse" = 1 ] && [ -x /usr/bin/python3 ] && py=/usr/bin/python3
  # shellcheck disable=SC2046
  timeout -k 5 70 "$py" tools/soap_torch_bench.py --emopt-dir "$emopt" --device $device \
    $(shape) --repeat 2 --warmup 1 >"$work/optim/soap.jsonl" 2>"$work/optim/soap_ref.err"
  local rc_ref=$? rc=0
  # shellcheck disable=SC2046
  timeout -k 5 60 "${mpirun[@]}" -np 1 "$bundle/apps/bench_optim/bench_optim" --device $device \
    $(shape) --repeat 2 --warmup 1 --only '=soap qr,=soap eigh,=rekls' --json \
    >>"$work/optim/soap.jsonl" 2>"$work/optim/soap_engine.err" || rc=1
  python3 - "$work/optim/soap.jsonl" "$work/parts/soap.json" "$rc_ref" "$rc" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
get = lambda impl, what: next((r["ms"] for r in rows if r["impl"] == impl and r["part"] == "step"
                                and r["what"] == what and r["np"] == 1), None)
table = {}
for what in ("soap qr", "soap eigh", "rekls"):
    ref, eng = get("reference", what), get("engine", what)
    table[what] = {"reference_ms": ref, "engine_ms": eng,
                   "reference_over_engine": round(ref / eng, 2) if ref and eng else None}
ok = sys.argv[3] == "0" and sys.argv[4] == "0" and all(v["reference_over_engine"] for v in table.values())
detail = "; ".join("%s: reference %s ms, engine %s ms, x%s" % (k, v["reference_ms"], v["engine_ms"],
                   v["reference_over_engine"]) for k, v in table.items())
json.dump({"part": "soap", "state": "ok" if ok else "FAIL", "detail": detail, "data": table},
          open(sys.argv[2], "w"))
sys.exit(0 if ok else 1)
PY
}

# ---- part ops: one step's worth of each op group of GPT-2 124M on the device ---------------
# bench_model --device cuda --op-groups (B 8 x T 1024): where the step's time goes, op by op.
part_ops() {
  if [ "$rehearse" = 1 ]; then
    "$bundle/apps/bench_model/bench_model" --help >"$work/bench_model.log" 2>&1 &&
      record ops skip "rehearsal: bench_model --device cuda needs a GPU (its --help ran)"
    return
  fi
  timeout -k 5 55 "$bundle/apps/bench_model/bench_model" --device cuda --json --steps 5 \
    --models gpt2_124m --precision fp32,bf16 --op-groups >"$work/bench_model.jsonl" 2>"$work/bench_model.err"
  local rc=$?
  python3 - "$work/bench_model.jsonl" "$work/parts/ops.json" "$rc" "$work/bench_model.err" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ok = sys.argv[3] == "0" and bool(rows)
detail = "; ".join(("%s %s: %.2f ms" % (r.get("precision", ""), r["group"], r["ms_per_step"])) if "group" in r
                   else "%s step: %.0f tok/s" % (r.get("precision", ""), r.get("tokens_per_s", 0)) for r in rows)
if not ok:
    said = [l.strip() for l in open(sys.argv[4], errors="replace") if l.strip()]
    detail += "; exit %s: %s" % (sys.argv[3], said[-1][:300] if said else "no message")
json.dump({"part": "ops", "state": "ok" if ok else "FAIL", "detail": detail, "data": {"rows": rows}},
          open(sys.argv[2], "w"))
sys.exit(0 if ok else 1)
PY
}

# ---- one part at a time, each boxed ---------------------------------------------------------
export -f record
for p in $only; do
  left=$((budget - (SECONDS)))
  box=$(box_of "$p")
  [ "$box" -gt "$left" ] && box=$left
  if [ "$box" -lt 15 ]; then
    record "$p" skip "not started: ${left} s of the ${budget} s budget left"
    continue
  fi
  echo "gpu_run: part $p (box $box s)"
  t0=$SECONDS
  # A part's function runs in a subshell in its own process group; timeout ends the group.
  timeout -k 5 "$box" bash -c "$(declare -p repo work bundle engine device rehearse steps recipe_steps \
    llmc_bin llmc_cudnn_bin mpirun found_dirs still_missing 2>/dev/null); $(declare -f); part_$p" >"$work/part_$p.log" 2>&1
  rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    # A command under its own timeout sits in a process group of its own: end those too.
    pkill -9 -f "$bundle/|soap_torch_bench|train_gpt2cu" 2>/dev/null
    record "$p" timeout "stopped after its box of $box s (see part_$p.log)"
  elif [ ! -f "$work/parts/$p.json" ]; then
    record "$p" FAIL "exit $rc and no record (see part_$p.log)"
  fi
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r["seconds"]=int(sys.argv[2]); json.dump(r, open(sys.argv[1], "w")); print("gpu_run: %-9s %-7s %s" % (r["part"], r["state"], r["detail"][:300]))' \
    "$work/parts/$p.json" "$((SECONDS - t0))"
done

# ---- summary ---------------------------------------------------------------------------------
python3 - "$work/parts" "$out" "$rehearse" "$((SECONDS))" $only <<'PY'
import json, os, sys, time
parts_dir, out, rehearse, seconds, order = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]), sys.argv[5:]
parts = [json.load(open(os.path.join(parts_dir, p + ".json"))) for p in order
         if os.path.exists(os.path.join(parts_dir, p + ".json"))]
summary = {"rehearsal": rehearse, "seconds": seconds, "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "ok": all(p["state"] in ("ok", "skip") for p in parts), "parts": parts}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
lines = ["gpu_run%s: %d s, %s" % (" (rehearsal)" if rehearse else "", seconds, "ok" if summary["ok"] else "FAILED"),
         "%-9s %-7s %5s  %s" % ("part", "state", "s", "detail")]
for p in parts:
    lines.append("%-9s %-7s %5s  %s" % (p["part"], p["state"], p.get("seconds", ""), p["detail"]))
speed = next((p for p in parts if p["part"] == "speed"), None)
if speed and speed["data"].get("rows"):
    d = speed["data"]
    lines += ["", "speed, %s: GPT-2 124M, B %s per step, np 1; MFU against the bf16 dense peak (%s TFLOP/s)"
              % (d["gpu"], d["batch"], d["peak_tflops_bf16"]),
              "%-22s %10s %9s %7s %9s %10s  %s" % ("run", "tok/s", "ms/step", "MFU", "peak MiB", "loss", "device phases (ms)")]
    for r in d["rows"]:
        mfu = "%.1f%%" % (100 * r["mfu_bf16_peak"]) if "mfu_bf16_peak" in r else "?"
        lines.append("%-22s %10s %9s %7s %9s %10s  %s" % (r["run"], r.get("tokens_per_s", "?"), r.get("ms_per_step", "?"),
                     mfu, r.get("peak_mib", "?"), r.get("train_loss_last10", ""),
                     ", ".join("%s %s" % kv for kv in r.get("device_phase_ms", {}).items())))
    issue = ["%s %s / %s" % (r["run"], r["host_issue_fb_ms"], r["device_phase_ms"]["forward_backward"])
             for r in d["rows"] if "host_issue_fb_ms" in r and "forward_backward" in r.get("device_phase_ms", {})]
    if issue:
        lines.append("  forward_backward, host issue / device ms: " + "; ".join(issue))
    for k, v in d["ratios"].items():
        lines.append("  %s: %s" % (k, v))
open(os.path.join(out, "summary.txt"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
cp "$work/nvidia-smi.txt" "$out/" 2>/dev/null
tar -C "$work" -czf "$out/logs.tar.gz" --exclude='*.bin' --exclude='ckpt' --exclude='*.safetensors' . 2>/dev/null
python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["ok"] else 1)' "$out/summary.json"
