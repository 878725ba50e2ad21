#!/usr/bin/env bash
# Several hosts on one machine: each host is a network namespace (its own address and host
# name) joined to a private bridge by a veth pair, and the engine runs across them over Open
# MPI's TCP transport, started in each namespace by an rsh agent that enters it. Three checks:
#
#   equal   np N over the hosts equals np N on one host: the losses of every step, bit for bit
#   resume  a checkpoint written across the hosts resumes on one host, continuing the same
#           trajectory (steps after the checkpoint equal the multi-host run's own)
#   cut     the last host's link is set down mid-run: the job ends within comm.timeout_s + 10 s,
#           naming the ranks that stopped answering (the engine's watchdog) or the lost host,
#           whose ranks the engine's banner lists (Open MPI, when it notices first)
#
#   tools/multihost.sh [--hosts 2] [--np 4] [--build build] [--work DIR] [--timeout-s 10 (whole seconds)]
#                        [--json] [CHECK ...]           (default: every check)
#
# Needs root and `ip netns` (iproute2); exits 77 where namespaces cannot be made. Traffic stays
# on the addresses of the namespaces this script makes (10.231.<k>.0/24 inside them); it
# deletes them, and ends every process it started in them, when it ends, also on failure.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
hosts=2 np=4 build="$repo/build" work="" timeout_s=10 json=0 checks=()
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    --work) work=$2; shift 2 ;;
    --timeout-s) timeout_s=$2; shift 2 ;;
    --json) json=1; shift ;;
    equal|resume|cut) checks+=("$1"); shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "multihost: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ ${#checks[@]} -gt 0 ] || checks=(equal resume cut)
[ "$hosts" -ge 2 ] && [ $((np % hosts)) -eq 0 ] ||
  { echo "multihost: --np ($np) must be a multiple of --hosts ($hosts >= 2)" >&2; exit 2; }
engine="$build/apps/engine/engine"
[ -x "$engine" ] || { echo "multihost: no engine at $engine (build first)" >&2; exit 2; }
work=${work:-$build/multihost}
rm -rf "$work" && mkdir -p "$work"
work=$(cd "$work" && pwd)

# ---- namespaces ---------------------------------------------------------------------------------
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! ip netns add "emh$$probe" 2>/dev/null; then
  echo "multihost: skipped: network namespaces cannot be made here (needs root and iproute2)"
  exit 77
fi
ip netns del "emh$$probe"
id=$$                           # names unique to this run: emh<pid>s (switch), emh<pid>h<i>
net="10.231.$((id % 250)).0"    # a /24 that exists only inside this run's namespaces
subnet="${net%.0}"
sw="emh${id}s"
ns_of() { echo "emh${id}h$1"; }
addr_of() { echo "$subnet.$1"; }
cleanup() {
  for i in $(seq 1 "$hosts"); do
    local ns; ns=$(ns_of "$i")
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  ip netns del "$sw" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ip netns add "$sw"
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
for i in $(seq 1 "$hosts"); do
  ns=$(ns_of "$i")
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip link add "v${id}h$i" netns "$ns" type veth peer name "p$i" netns "$sw"
  ip -n "$ns" link set "v${id}h$i" name eth0
  ip -n "$ns" addr add "$(addr_of "$i")/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$sw" link set "p$i" master br0
  ip -n "$sw" link set "p$i" up
done

# Daemons start through tools/netns_agent.sh, an rsh agent that enters a host's namespace.
export MULTIHOST_NS_PREFIX="emh${id}h"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mca=(--mca btl tcp,self --mca btl_tcp_if_include "$net/24" --mca oob_tcp_if_include "$net/24"
  --mca plm_rsh_agent "$repo/tools/netns_agent.sh" --bind-to none --oversubscribe
  # TCP keepalive on the daemons' connections (Open MPI's default: 300 s idle, then 9 probes 20 s
  # apart): a daemon whose host vanished is declared lost after about 5 s and the job ends,
  # rather than an abort waiting minutes for it. Clusters tune the same parameters.
  --mca oob_tcp_keepalive_time 2 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3)
# in_host1 CMD...: runs CMD in host 1's namespace (where mpirun runs) under host 1's name.
in_host1() { ip netns exec "$(ns_of 1)" unshare --uts -- sh -c 'hostname host1; exec "$@"' sh "$@"; }
hostfile() {  # hostfile N_HOSTS: np/N_HOSTS slots on each of the first N hosts
  for i in $(seq 1 "$1"); do echo "$(addr_of "$i") slots=$((np / $1))"; done
}

# ---- data and the run --------------------------------------------------------------------------
python3 "$repo/tests/e2e/make_tiny_data.py" "$work/data/tiny" >/dev/null
cp "$repo/configs/tiny.yaml" "$work/tiny.yaml"
cd "$work"
# engine_run NAME N_HOSTS [--set ...]: the tiny config at np over N_HOSTS hosts into runs/NAME.
engine_run() {
  local name=$1 n=$2; shift 2
  hostfile "$n" > "hosts_$name"
  in_host1 mpirun "${mca[@]}" --hostfile "hosts_$name" -np "$np" "$engine" --config tiny.yaml \
    --set log.dir="runs/$name" --set checkpoint.dir="runs/$name/checkpoints" \
    --set comm.timeout_s="$timeout_s" "$@"
}
losses() { python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "train_loss" in r: print(r["step"], repr(r["train_loss"]))' "runs/$1/metrics.jsonl"; }
results=()
result() { results+=("$1|$2|$3"); }

check_equal() {
  engine_run one_host 1 > one_host.log 2>&1 || { cat one_host.log; return 1; }
  engine_run hosts "$hosts" > hosts.log 2>&1 || { cat hosts.log; return 1; }
  grep -q "on host2" hosts.log || { echo "multihost: no rank ran on host2" >&2; cat hosts.log; return 1; }
  if diff <(losses one_host) <(losses hosts) > equal.diff; then
    result equal ok "np $np: $(losses hosts | wc -l) steps, losses bit-identical on 1 and $hosts hosts (final $(losses hosts | tail -1 | cut -d' ' -f2))"
  else
    result equal FAIL "losses differ (equal.diff)"; return 1
  fi
}

check_resume() {
  [ -f runs/hosts/metrics.jsonl ] || engine_run hosts "$hosts" > hosts.log 2>&1
  local ckpt=runs/hosts/checkpoints/step_00000010
  [ -d "$ckpt" ] || { result resume FAIL "no checkpoint $ckpt"; return 1; }
  # The resume's folder holds the checkpoint it resumes from and nothing newer (a resume from an
  # older checkpoint than others in its folder is refused: its saves would replace them).
  rm -rf resumed_checkpoints && mkdir resumed_checkpoints && cp -r "$ckpt" resumed_checkpoints/
  engine_run resumed 1 --set checkpoint.resume="$work/$ckpt" \
    --set checkpoint.dir="$work/resumed_checkpoints" > resumed.log 2>&1 || { cat resumed.log; return 1; }
  local resumed_steps; resumed_steps=$(losses resumed | wc -l)
  if diff <(losses hosts | awk '$1 > 10') <(losses resumed) > resume.diff && [ "$resumed_steps" -gt 0 ]; then
    result resume ok "step 10 of the $hosts-host run resumed on 1 host: steps 11-$(losses resumed | tail -1 | cut -d' ' -f1) bit-identical"
  else
    result resume FAIL "resumed losses differ (resume.diff)"; return 1
  fi
}

check_cut() {
  local last=$hosts start end elapsed
  # Each output line stamped with the seconds since the link went down (cut.log).
  engine_run cut "$hosts" --set train.steps=100000 --set checkpoint.every=0 \
    --set checkpoint.at_end=false 2>&1 | python3 -u -c '
import os, sys, time
for line in sys.stdin:
    t = os.path.getmtime("cut_start") if os.path.exists("cut_start") else None
    print(f"{time.time() - t:+8.2f} " if t else "         ", line, end="", sep="")' > cut.log &
  local pid=$!
  for _ in $(seq 1 300); do  # wait for training steps
    grep -q "step:3/" cut.log 2>/dev/null && break
    sleep 0.1
  done
  start=$(date +%s.%N)
  touch cut_start
  ip -n "$sw" link set "p$last" down
  local waited=0
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt $(((timeout_s + 30) * 10)) ]; do
    sleep 0.1; waited=$((waited + 1))
  done
  end=$(date +%s.%N)
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  elapsed=$(python3 -c "print(f'{$end - $start:.1f}')")
  # Who ends the job: the engine's watchdog (it names the ranks that stopped answering), or,
  # when its retransmissions fail first, Open MPI's daemon (it names the lost node, whose ranks
  # the engine's banner lists).
  local named
  named=$(grep -m1 "comm watchdog" cut.log | grep -o "rank(s) [0-9, ]* did not answer" || true)
  if [ -z "$named" ] && grep -q "lost communication with a remote daemon" cut.log; then
    local node ranks
    node=$(grep -m1 -o "Remote daemon: .* on node [0-9.]*" cut.log | grep -o "[0-9.]*$")
    ranks=$(grep -o "^ *rank [0-9]*: .* on host${node##*.}$" cut.log | grep -o "rank [0-9]*" | paste -sd, - | sed "s/,/, /g" || true)
    named="Open MPI: lost the daemon on $node (host${node##*.}; the banner puts ${ranks:-no rank} there)"
  fi
  if python3 -c "import sys; sys.exit(0 if $elapsed <= $timeout_s + 10 else 1)" && [ -n "$named" ]; then
    result cut ok "host$last's link down: job ended after ${elapsed} s (comm.timeout_s $timeout_s); $named"
  else
    result cut FAIL "ended after ${elapsed} s (limit $((timeout_s + 10)) s), named: '${named}' (cut.log)"
    tail -20 cut.log
    return 1
  fi
}

status=0
for c in "${checks[@]}"; do "check_$c" || status=1; done
if [ "$json" = 1 ]; then
  for r in "${results[@]}"; do
    IFS='|' read -r name state detail <<<"$r"
    python3 -c 'import json,sys; print(json.dumps({"check":sys.argv[1],"state":sys.argv[2],"detail":sys.argv[3],"hosts":int(sys.argv[4]),"np":int(sys.argv[5])}))' \
      "$name" "$state" "$detail" "$hosts" "$np"
  done
else
  printf '%-7s %-5s %s\n' check state detail
  for r in "${results[@]}"; do IFS='|' read -r name state detail <<<"$r"; printf '%-7s %-5s %s\n' "$name" "$state" "$detail"; done
fi
exit $status
