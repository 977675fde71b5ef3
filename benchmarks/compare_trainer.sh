#!/usr/bin/env bash
# The Fashion-MNIST trainer against the same training in PyTorch's own DDP
# (trainer_peer.py), in one run (BENCHMARKS.md): the same network, data, sampler,
# Adam and batch per rank, both started by `cohort run` with Gloo and one thread per
# rank. Alternates the two sides REPS times after one warm-up run each, then prints
# each side's median training rate (samples/s over all ranks, evaluation excluded).
#   benchmarks/compare_trainer.sh [BUILD_DIR] [NPROC] [STEPS] [REPS]
set -euo pipefail
build=${1:-build}
nproc=${2:-2}
steps=${3:-300}
reps=${4:-3}
here=$(cd "$(dirname "$0")" && pwd)
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
cohort=$build/tools/cohort/cohort
trainer=$build/examples/fashion_mnist/fashion_mnist
common=(--epochs 1 --batch-size 32 --lr 2e-3 --limit-train-batches "$steps")

rate() {  # the samples_per_second of rank 0's JSON line
  "$cohort" run --nproc-per-node "$nproc" --local-ranks-filter 0 "$@" | grep '{' | sed 's/^\[rank0\]: //' |
    tee /dev/stderr | /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["samples_per_second"])'
}

cohort_rates=() peer_rates=()
rate "$trainer" "${common[@]}" >/dev/null   # warm-up: page cache, first-touch
rate /usr/bin/python3 "$here/trainer_peer.py" "${common[@]}" >/dev/null
for ((i = 0; i < reps; i++)); do
  cohort_rates+=("$(rate "$trainer" "${common[@]}")")
  peer_rates+=("$(rate /usr/bin/python3 "$here/trainer_peer.py" "${common[@]}")")
done
/usr/bin/python3 - "${cohort_rates[*]}" "${peer_rates[*]}" "$nproc" "$steps" <<'PY'
import statistics, sys
c = [float(x) for x in sys.argv[1].split()]
p = [float(x) for x in sys.argv[2].split()]
print(f"world {sys.argv[3]}, {sys.argv[4]} steps of batch 32 per rank, {len(c)} repetitions")
print(f"{'side':10} {'median samples/s':>17}  runs")
print(f"{'cohort':10} {statistics.median(c):17.0f}  {' '.join(f'{x:.0f}' for x in c)}")
print(f"{'pytorch':10} {statistics.median(p):17.0f}  {' '.join(f'{x:.0f}' for x in p)}")
print(f"cohort / pytorch: {statistics.median(c) / statistics.median(p):.2f}")
PY
