#!/usr/bin/env bash
# The Fashion-MNIST trainer against the same training in PyTorch's own DDP
# (trainer_peer.py), in one run (BENCHMARKS.md): the same network, data, sampler,
# Adam and batch per rank, both started by `cohort run` with Gloo and one thread per
# rank. Alternates the two sides REPS times after one warm-up run each, then prints
# each side's median training rate (samples/s over all ranks, evaluation excluded),
# once per allocator setting (Note [Equal allocator settings] in bench_env.sh).
#   benchmarks/compare_trainer.sh [BUILD_DIR] [NPROC] [STEPS] [REPS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/bench_env.sh"
build=${1:-build}
nproc=${2:-2}
steps=${3:-300}
reps=${4:-3}
if [[ $bench_smoke == 1 ]]; then steps=5 reps=1; fi
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
cohort=$build/tools/cohort/cohort
trainer=$build/examples/fashion_mnist/fashion_mnist
common=(--epochs 1 --batch-size 32 --lr 2e-3 --limit-train-batches "$steps")

rate() {  # SETTING ARGS...: the samples_per_second of rank 0's JSON line
  local setting=$1
  shift
  # shellcheck disable=SC2046
  env $(malloc_env "$setting") "$cohort" run --nproc-per-node "$nproc" --local-ranks-filter 0 "$@" |
    grep '{' | sed 's/^\[rank0\]: //' | tee /dev/stderr |
    /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["samples_per_second"])'
}

for setting in "${malloc_settings[@]}"; do
  cohort_rates=() peer_rates=()
  rate "$setting" "$trainer" "${common[@]}" >/dev/null   # warm-up: page cache, first-touch
  rate "$setting" "${peer_conf[@]}" /usr/bin/python3 "$here/trainer_peer.py" "${common[@]}" >/dev/null
  for ((i = 0; i < reps; i++)); do
    cohort_rates+=("$(rate "$setting" "$trainer" "${common[@]}")")
    peer_rates+=("$(rate "$setting" "${peer_conf[@]}" /usr/bin/python3 "$here/trainer_peer.py" "${common[@]}")")
  done
  /usr/bin/python3 - "${cohort_rates[*]}" "${peer_rates[*]}" "$nproc" "$steps" "$setting" <<'PY'
import statistics, sys
c = [float(x) for x in sys.argv[1].split()]
p = [float(x) for x in sys.argv[2].split()]
print(f"world {sys.argv[3]}, {sys.argv[4]} steps of batch 32 per rank, {len(c)} repetitions, "
      f"allocator: {sys.argv[5]}")
print(f"{'side':10} {'median samples/s':>17}  runs")
print(f"{'cohort':10} {statistics.median(c):17.0f}  {' '.join(f'{x:.0f}' for x in c)}")
print(f"{'pytorch':10} {statistics.median(p):17.0f}  {' '.join(f'{x:.0f}' for x in p)}")
print(f"cohort / pytorch: {statistics.median(c) / statistics.median(p):.2f}")
PY
done
