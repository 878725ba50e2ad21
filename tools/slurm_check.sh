#!/usr/bin/env bash
# The engine under Slurm, as clusters run it, on one machine: starts a private Slurm (its own
# slurm.conf, spool and state folders, munge key and socket, ports 16817/16818 on this host; one
# node), then
#
#   srun     sbatch a script that runs `srun --mpi=pmix -n 2 engine ...` (PMIx wire-up, no mpirun)
#   mpirun   sbatch a script that runs `mpirun engine ...` inside the allocation (Open MPI
#            launches through Slurm)
#   scancel  a long run cancelled with scancel leaves a checkpoint (SIGTERM -> the engine
#            finishes its step and saves), and a second job resumes from it
#
# and stops every daemon it started, also on failure. Installs Debian's Slurm 22.05 and munge
# when missing (root). Prints one row per check; exits non-zero when one fails.
#
#   tools/slurm_check.sh [--build build] [--work DIR] [srun] [mpirun] [scancel]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build="$repo/build" work="" checks=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    --work) work=$2; shift 2 ;;
    srun|mpirun|scancel) checks+=("$1"); shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "slurm_check: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ ${#checks[@]} -gt 0 ] || checks=(srun mpirun scancel)
engine="$build/apps/engine/engine"
[ -x "$engine" ] || { echo "slurm_check: no engine at $engine (build first)" >&2; exit 2; }
work=${work:-$build/slurm_check}
rm -rf "$work" && mkdir -p "$work"
work=$(cd "$work" && pwd)

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
  || ! command -v sbatch >/dev/null; then
  [ "$(id -u)" = 0 ] || { echo "slurm_check: skipped: Slurm is not installed and this is not root"; exit 77; }
  echo "slurm_check: installing slurmctld slurmd slurm-client munge"
  export DEBIAN_FRONTEND=noninteractive
  pkgs=(slurmctld slurmd slurm-client munge)
  apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null; } ||
    { echo "slurm_check: skipped: could not install ${pkgs[*]}"; exit 77; }
fi

# ---- a private Slurm ---------------------------------------------------------------------------
mkdir -p "$work"/{etc,spool,state,log,munge}
chmod 711 "$work/munge"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge/munge.key"
node=$(hostname)
cat > "$work/etc/slurm.conf" <<EOF
ClusterName=enginecheck
SlurmctldHost=$node
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
KillWait=20
ReturnToService=2
NodeName=$node CPUs=4 State=UNKNOWN
PartitionName=check Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF="$work/etc/slurm.conf"
pids=()
cleanup() {
  scancel --quiet --user=root 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 1
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
munged --force --foreground --socket="$work/munge/munge.socket" --key-file="$work/munge/munge.key" \
  --pid-file="$work/munge/munged.pid" --log-file="$work/log/munged.log" \
  --seed-file="$work/munge/munged.seed" > "$work/log/munged.out" 2>&1 &
pids+=($!)
slurmctld -D -i > "$work/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D > "$work/log/slurmd.out" 2>&1 &
pids+=($!)
for _ in $(seq 1 60); do
  sinfo -h -o %t 2>/dev/null | grep -q idle && break
  sleep 0.5
done
sinfo -h -o %t 2>/dev/null | grep -q idle ||
  { echo "slurm_check: the node did not come up"; tail -5 "$work"/log/*.log; exit 1; }

# ---- jobs ----------------------------------------------------------------------------------------
python3 "$repo/tests/e2e/make_tiny_data.py" "$work/data/tiny" >/dev/null
cp "$repo/configs/tiny.yaml" "$work/tiny.yaml"
cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
results=()
result() { results+=("$1|$2|$3"); }
# wait_job ID: until the job has left the queue; prints its final state.
wait_job() {
  for _ in $(seq 1 600); do
    squeue -h -j "$1" 2>/dev/null | grep -q . || break
    sleep 0.5
  done
  scontrol show job "$1" 2>/dev/null | grep -o "JobState=[A-Z_]*" | cut -d= -f2
}
# show_job ID OUT: what a failed check prints: how far the job got (its last step lines), the rest
# of its output (a backtrace, an error), and what Slurm saw (state, exit code, the slurmd log's
# signals and task exits), so a failure seen once in CI can be read after the fact.
show_job() {
  echo "--- job $1: last steps in $2"
  grep -E "^step:[0-9]+/" "$2" | tail -2
  echo "--- job $1: other output in $2"
  grep -v -E "^step:[0-9]+/" "$2" | tail -40
  echo "--- job $1: slurm"
  scontrol show job "$1" 2>/dev/null | grep -o -E "(JobState|Reason|ExitCode|RunTime|StartTime|EndTime)=[^ ]*" | tr '\n' ' '
  echo
  grep -i -E "signal|exit|kill|error" "$work/log/slurmd.log" 2>/dev/null | tail -15
}
submit() {  # submit NAME LAUNCHER EXTRA...: sbatch scripts/slurm/train.sbatch, prints the job id
  local name=$1 launcher=$2; shift 2
  ENGINE="$engine" CONFIG=tiny.yaml LAUNCHER=$launcher sbatch --parsable -n 2 -J "$name" \
    -o "$name.out" --export=ALL "$repo/scripts/slurm/train.sbatch" \
    --set log.dir="runs/$name" --set checkpoint.dir="runs/$name/checkpoints" "$@"
}

check_srun() {
  local id state
  id=$(submit srun srun --set train.steps=10)
  state=$(wait_job "$id")
  if [ "$state" = COMPLETED ] && grep -q "^done: 10 steps" srun.out && grep -q "world size 2" srun.out; then
    result srun ok "job $id: srun --mpi=pmix -n 2, 10 steps, $(grep -o 'final val_loss [0-9.]*' srun.out)"
  else
    result srun FAIL "job $id ended $state (srun.out)"; show_job "$id" srun.out; return 1
  fi
}

check_mpirun() {
  local id state
  id=$(submit mpirun mpirun --set train.steps=10)
  state=$(wait_job "$id")
  if [ "$state" = COMPLETED ] && grep -q "^done: 10 steps" mpirun.out && grep -q "world size 2" mpirun.out; then
    result mpirun ok "job $id: mpirun inside the allocation, 10 steps, $(grep -o 'final val_loss [0-9.]*' mpirun.out)"
  else
    result mpirun FAIL "job $id ended $state (mpirun.out)"; show_job "$id" mpirun.out; return 1
  fi
}

check_scancel() {
  local id state ckpt step id2 state2
  id=$(submit cancelled srun --set train.steps=100000 --set checkpoint.every=0)
  for _ in $(seq 1 240); do grep -q "step:5/" cancelled.out 2>/dev/null && break; sleep 0.5; done
  local before; before=$(grep -E "^step:[0-9]+/" cancelled.out 2>/dev/null | tail -1)
  scancel "$id"
  state=$(wait_job "$id")
  ckpt=$(ls -d runs/cancelled/checkpoints/step_* 2>/dev/null | tail -1)
  [ -n "$ckpt" ] || { result scancel FAIL "job $id ($state): no checkpoint (cancelled.out)"; echo "--- scancel was sent after: $before"; show_job "$id" cancelled.out; return 1; }
  step=$((10#${ckpt##*step_}))
  # The same run again with checkpoint.resume=auto, cancelled after three more steps.
  id2=$(ENGINE="$engine" CONFIG=tiny.yaml LAUNCHER=srun sbatch --parsable -n 2 -J resumed \
    -o resumed.out --export=ALL "$repo/scripts/slurm/train.sbatch" --set log.dir=runs/cancelled \
    --set checkpoint.dir=runs/cancelled/checkpoints --set train.steps=100000 \
    --set checkpoint.every=0 --set checkpoint.resume=auto)
  for _ in $(seq 1 240); do grep -q "step:$((step + 3))/" resumed.out 2>/dev/null && break; sleep 0.5; done
  scancel "$id2"
  state2=$(wait_job "$id2")
  local last; last=$(ls -d runs/cancelled/checkpoints/step_* | tail -1)
  if grep -q "^resumed from .*/step_$(printf %08d "$step") at step $step" resumed.out &&
    grep -q "step:$((step + 1))/" resumed.out; then
    result scancel ok "job $id cancelled after step $step ($state) left $(basename "$ckpt"); job $id2 resumed from it, trained on, was cancelled too ($state2) and left $(basename "$last")"
  else
    result scancel FAIL "job $id2 did not resume from $ckpt (resumed.out)"; show_job "$id2" resumed.out; return 1
  fi
}

status=0
for c in "${checks[@]}"; do "check_$c" || status=1; done
printf '%-8s %-5s %s\n' check state detail
for r in "${results[@]}"; do IFS='|' read -r name state detail <<<"$r"; printf '%-8s %-5s %s\n' "$name" "$state" "$detail"; done
exit $status
