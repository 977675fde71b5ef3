#!/usr/bin/env bash
# `make run`'s time to 0.90 test accuracy against PyTorch's DDP peer (trainer_peer.py)
# with the same network, memory format, data, Adam schedule, batch, BLAS and threads,
# in one run (BENCHMARKS.md). Both sides run 2 processes under `cohort run` for
# EPOCHS epochs and evaluate after each; the time is the wall time since start at the
# end of the first epoch that reaches 0.90. cohort runs exactly as `make run` does
# (checkpoints every 200 steps and per epoch); the peer writes none. Alternates the
# two sides REPS times and prints the medians.
#   benchmarks/time_to_accuracy.sh [BUILD_DIR] [EPOCHS] [REPS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/bench_env.sh"
build=${1:-build}
epochs=${2:-2}
reps=${3:-2}
# A smoke run trains one short epoch, which reaches no accuracy worth timing: it
# proves both sides run and print their epoch lines ("nan" when 0.90 is not reached).
limit=()
if [[ $bench_smoke == 1 ]]; then epochs=1 reps=1 limit=(--limit-train-batches 5); fi
export GLOO_SOCKET_IFNAME=lo
cohort=$build/tools/cohort/cohort
trainer=$build/examples/fashion_mnist/fashion_mnist
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

seconds_to_090() {  # prints the first epoch line at or above 0.90, and its seconds
  "$cohort" run --nproc-per-node 2 --local-ranks-filter 0 "$@" | grep 'test accuracy' | tee /dev/stderr |
    /usr/bin/python3 -c '
import re, sys
for line in sys.stdin:
    m = re.search(r"test accuracy ([0-9.]+).* ([0-9.]+) s since start", line)
    if m and float(m.group(1)) >= 0.90:
        print(m.group(2)); break
else:
    print("nan")'
  [[ ${PIPESTATUS[0]} == 0 ]]
}

ours=() peer=()
for ((i = 0; i < reps; i++)); do
  rm -rf "$scratch/ckpt"
  ours+=("$(seconds_to_090 "$trainer" --epochs "$epochs" --checkpoint-dir "$scratch/ckpt" --checkpoint-every 200 "${limit[@]}")")
  peer+=("$(seconds_to_090 "${peer_conf[@]}" /usr/bin/python3 "$here/trainer_peer.py" --epochs "$epochs" --evaluate \
    "${limit[@]}")")
done
/usr/bin/python3 - "${ours[*]}" "${peer[*]}" <<'PY'
import statistics, sys
c = [float(x) for x in sys.argv[1].split()]
p = [float(x) for x in sys.argv[2].split()]
print(f"seconds to 0.90 test accuracy, world 2, batch 32 per rank, {len(c)} repetitions")
print(f"{'side':10} {'median s':>9}  runs")
print(f"{'cohort':10} {statistics.median(c):9.1f}  {' '.join(f'{x:.1f}' for x in c)}")
print(f"{'pytorch':10} {statistics.median(p):9.1f}  {' '.join(f'{x:.1f}' for x in p)}")
print(f"pytorch / cohort: {statistics.median(p) / statistics.median(c):.2f}")
PY
