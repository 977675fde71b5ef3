#!/usr/bin/env bash
# Issue 14's trainer-level comparisons (BENCHMARKS.md), each side REPS times after a
# warm-up, medians of the training rate (samples/s, evaluation excluded), one thread
# per worker:
#  1. DataParallel (one process, 2 CPU replicas, batch 64) against DDP (2 processes x
#     32) and one process without replicas (batch 64);
#  2. bf16 autocast against float32 at world 2, cohort's trainer beside PyTorch's own
#     DDP with torch.autocast (trainer_peer.py --amp bf16), same model and data.
#   benchmarks/compare_issue14.sh [BUILD_DIR] [STEPS] [REPS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/bench_env.sh"
build=${1:-build}
steps=${2:-200}
reps=${3:-3}
if [[ $bench_smoke == 1 ]]; then steps=5 reps=1; fi
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
cohort=$build/tools/cohort/cohort
trainer=$build/examples/fashion_mnist/fashion_mnist
common=(--epochs 1 --lr 2e-3 --limit-train-batches "$steps")

rate() {  # NPROC ARGS...: the samples_per_second of rank 0's JSON line
  local n=$1
  shift
  "$cohort" run --nproc-per-node "$n" --local-ranks-filter 0 "$@" | grep '{' | sed 's/^\[rank0\]: //' |
    /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["samples_per_second"])'
}

declare -A rates
sides=(
  "single|1|$trainer ${common[*]} --batch-size 64"
  "dataparallel-2|1|$trainer ${common[*]} --batch-size 64 --data-parallel-replicas 2"
  "ddp-2|2|$trainer ${common[*]} --batch-size 32"
  "cohort-fp32|2|$trainer ${common[*]} --batch-size 32"
  "cohort-bf16|2|$trainer ${common[*]} --batch-size 32 --amp bf16"
  "pytorch-fp32|2|${peer_conf[*]} /usr/bin/python3 $here/trainer_peer.py ${common[*]} --batch-size 32"
  "pytorch-bf16|2|${peer_conf[*]} /usr/bin/python3 $here/trainer_peer.py ${common[*]} --batch-size 32 --amp bf16"
)
for side in "${sides[@]}"; do  # warm-up
  IFS='|' read -r name n cmd <<<"$side"
  # shellcheck disable=SC2086
  rate "$n" $cmd >/dev/null
done
for ((i = 0; i < reps; i++)); do
  for side in "${sides[@]}"; do
    IFS='|' read -r name n cmd <<<"$side"
    # shellcheck disable=SC2086
    rates[$name]+="$(rate "$n" $cmd) "
  done
done
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for side in "${sides[@]}"; do
  IFS='|' read -r name n cmd <<<"$side"
  echo "$name ${rates[$name]}" >>"$rows"
done
/usr/bin/python3 - "$rows" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, *values = line.split()
    rows[name] = [float(x) for x in values]
med = {k: statistics.median(v) for k, v in rows.items()}
print(f"{len(next(iter(rows.values())))} repetitions; samples/s over all ranks, median (runs)")
for k, v in rows.items():
    runs = " ".join(f"{x:.0f}" for x in v)
    print(f"{k:16} {med[k]:8.0f}   ({runs})")
print(f"DataParallel / single: {med['dataparallel-2'] / med['single']:.2f}; DDP / single: {med['ddp-2'] / med['single']:.2f}")
print(f"bf16 / fp32: cohort {med['cohort-bf16'] / med['cohort-fp32']:.2f}, pytorch {med['pytorch-bf16'] / med['pytorch-fp32']:.2f}; "
      f"cohort / pytorch in bf16: {med['cohort-bf16'] / med['pytorch-bf16']:.2f}, in fp32: {med['cohort-fp32'] / med['pytorch-fp32']:.2f}")
PY
