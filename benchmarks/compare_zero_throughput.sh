#!/usr/bin/env bash
# Step time of DDP, ZeRO-1, ZeRO-2 and ZeRO-3 (docs/zero.md; zero3 is FULL_SHARD,
# zero3-grad-op SHARD_GRAD_OP) on a 21M-parameter model with Adam, world 2, Gloo, one
# thread per rank, side by side with PyTorch on the same model and protocol
# (benchmarks/zero_peer.py): its DDP and ZeroRedundancyOptimizer
# (Debian 12's PyTorch 1.13, under `cohort run`), and its DDP, ZeroRedundancyOptimizer
# and FSDP (SHARD_GRAD_OP and FULL_SHARD) from PyPI's PyTorch 2.11 (Note [The
# PyTorch 2 peer] in bench_env.sh). Each line:
# the median of 7 timed repetitions of 3 steps after 3 warm-up steps, the slowest
# rank's. Needs a quiet machine (a build beside it cuts the figures several-fold).
# ZERO_BENCH_ARGS="--width 512 --reps 3" for a smoke run.
#   benchmarks/compare_zero_throughput.sh [BUILD_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/bench_env.sh"
build=${1:-build}
read -r -a extra <<< "${ZERO_BENCH_ARGS:-}"
if [[ $bench_smoke == 1 ]]; then extra=(--width 256 --reps 1); fi
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
cohort=("$build/tools/cohort/cohort" run --nproc-per-node 2 --local-ranks-filter 0)
for mode in ddp zero1 zero2 zero3 zero3-grad-op; do
  "${cohort[@]}" "$build/benchmarks/zero_bench" throughput --mode "$mode" "${extra[@]}" | sed 's/^\[rank0\]: //'
done
for mode in ddp zero1; do
  # Stock c10d workers get a plain TCPStore (docs/store_security.md).
  "${cohort[@]}" "${peer_conf[@]}" /usr/bin/python3 "$here/zero_peer.py" --mode "$mode" \
    "${extra[@]}" | sed 's/^\[rank0\]: //'
done
py2=$(torch2_python)
for mode in ddp zero1 fsdp-grad-op fsdp-full; do
  GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 "$py2" -u "$here/zero_peer.py" --torchrun 2 --mode "$mode" "${extra[@]}" |
    grep '^{'
done
