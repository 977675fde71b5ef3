#!/usr/bin/env bash
# The elastic launcher across real network hosts on one machine: each agent runs in
# a network namespace of its own, with its own address on a private bridge, so the
# store, the rendezvous and Gloo cross a network as they would between machines.
# Needs root (ip netns); CI runs as root. Every step is bounded by `timeout`, and the
# script fails if any process is left in a namespace.
#
# Usage: tests/netns/elastic_hosts.sh COHORT_CLI TRAINER
set -euo pipefail
cli=$1
trainer=$2
tag=$$
sw=cohort-sw-$tag
hosts=(cohort-h1-$tag cohort-h2-$tag cohort-h3-$tag)
net=10.$((RANDOM % 200 + 20)).$((RANDOM % 250))
port=$((20000 + RANDOM % 20000))  # inside fresh namespaces nothing else can hold it
work=$(mktemp -d /tmp/cohort-netns-XXXXXX)
export COHORT_RDZV_TOKEN=netns-test-token-$RANDOM$RANDOM$RANDOM
export COHORT_TIMEOUT=30

fail() { echo "FAIL: $*" >&2; exit 1; }

cleanup() {
  for ns in "${hosts[@]}" "$sw"; do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -n $pids ]] && kill -9 $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

[[ $(id -u) == 0 ]] || fail "needs root for ip netns (CI runs as root)"
ip netns add "$sw"
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
for i in 1 2 3; do
  ns=${hosts[$((i - 1))]}
  ip netns add "$ns"
  ip link add "cv$i-$tag" type veth peer name "cs$i-$tag"
  ip link set "cv$i-$tag" netns "$ns"
  ip link set "cs$i-$tag" netns "$sw"
  ip -n "$sw" link set "cs$i-$tag" master br0 up
  ip -n "$ns" addr add "$net.$i/24" dev "cv$i-$tag"
  ip -n "$ns" link set "cv$i-$tag" up
  ip -n "$ns" link set lo up
done

# agent I NNODES LOG [FLAGS...]: an agent on host I, in the background.
agent() {
  local i=$1 nnodes=$2 log=$3
  shift 3
  GLOO_SOCKET_IFNAME="cv$i-$tag" timeout 300 ip netns exec "${hosts[$((i - 1))]}" \
    "$cli" run --nnodes "$nnodes" --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint "$net.1:$port" \
    --rdzv-id "netns$tag" --rdzv-conf join_timeout=60,last_call_timeout=1,keep_alive_interval=1 \
    --monitor-interval 0.5 --stop-timeout 3 "$@" >"$log" 2>&1 &
}
train_args() {
  echo --epochs 1 --limit-train-batches "$1" --batch-size 16 --optimizer sgd --lr 0.05 --seed 3 \
    --checkpoint-dir "$work/$2" --checkpoint-every 10
}
wait_for() {  # wait_for SECONDS COMMAND...: polls until COMMAND succeeds
  local limit=$1
  shift
  for ((t = 0; t < limit * 10; t++)); do "$@" && return 0; sleep 0.1; done
  return 1
}
no_processes_left() {
  for ns in "${hosts[@]}"; do [[ -z $(ip netns pids "$ns") ]] || return 1; done
}

echo "== two hosts train together; the store listens on host 1's address only"
agent 1 2 "$work/a1.log" "$trainer" $(train_args 40 one)
a1=$!
wait_for 30 grep -qs "hosts the rendezvous store on $net.1:$port" "$work/a1.log" || { cat "$work/a1.log"; fail "host 1 did not host the store"; }
ip netns exec "${hosts[0]}" ss -ltn | grep -q "$net.1:$port " || fail "the store is not bound to $net.1:$port"
agent 2 2 "$work/a2.log" "$trainer" $(train_args 40 one)
a2=$!
wait $a1 || { cat "$work/a1.log" "$work/a2.log"; fail "host 1's agent failed"; }
wait $a2 || { cat "$work/a1.log" "$work/a2.log"; fail "host 2's agent failed"; }
grep -q '"world_size":2' "$work/a1.log" "$work/a2.log" || fail "the job did not train at world size 2"
no_processes_left || fail "processes left after a finished job"

echo "== host 2 dies and host 1 goes on alone; a stranger (host 3) with the wrong token is refused"
agent 1 1:2 "$work/b1.log" "$trainer" $(train_args 200 two)
b1=$!
wait_for 30 grep -qs "hosts the rendezvous store" "$work/b1.log" || { cat "$work/b1.log"; fail "no store"; }
agent 2 1:2 "$work/b2.log" "$trainer" $(train_args 200 two)
b2=$!
wait_for 60 test -d "$work/two/step-000000010" || { cat "$work/b1.log" "$work/b2.log"; fail "no checkpoint"; }
grep -q "node 0 of 2\|node 1 of 2" "$work/b1.log" || { cat "$work/b1.log"; fail "host 2 never joined"; }
# The agent itself (not `timeout`, its parent): its worker goes with it (PDEATHSIG).
for p in $(ip netns pids "${hosts[1]}"); do [[ $(cat /proc/$p/comm) == cohort ]] && kill -9 "$p"; done
wait $b2 2>/dev/null || true
set +e
COHORT_RDZV_TOKEN=wrong-token-of-a-stranger-$RANDOM GLOO_SOCKET_IFNAME="cv3-$tag" timeout 60 \
  ip netns exec "${hosts[2]}" "$cli" run --nnodes 1:2 --rdzv-backend c10d --rdzv-endpoint "$net.1:$port" \
  --rdzv-id "netns$tag" "$trainer" >"$work/c3.log" 2>&1
code=$?
set -e
[[ $code == 2 ]] || { cat "$work/c3.log"; fail "the stranger's agent exited $code, not 2"; }
grep -q "refused" "$work/c3.log" || { cat "$work/c3.log"; fail "the stranger was not told it was refused"; }
wait $b1 || { cat "$work/b1.log"; fail "host 1 did not finish after host 2 died"; }
grep -q "refused a connection" "$work/b1.log" || { cat "$work/b1.log"; fail "the store did not report the refusal"; }
grep -q "a node left the job" "$work/b1.log" || { cat "$work/b1.log"; fail "host 2's death was not seen as a membership change"; }
grep -q '"world_size":1' "$work/b1.log" || { cat "$work/b1.log"; fail "host 1 did not finish at world size 1"; }
no_processes_left || fail "processes left after host 2 was killed"
echo "PASS: elastic agents across network namespaces"
