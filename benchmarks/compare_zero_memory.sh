#!/usr/bin/env bash
# Memory per rank: DDP against ZeRO-1, ZeRO-2 and ZeRO-3 (FULL_SHARD and SHARD_GRAD_OP)
# on a 21M-parameter model with Adam, at worlds 2 and 4, each in fresh processes
# (BENCHMARKS.md, docs/zero.md). Memory is not disturbed by other load, so this needs
# no quiet machine.
# Then the same at world 4 with 4 MiB buckets: ZeRO-2's transient gradients scale
# with the bucket size, which is large against this model's 16 MiB layers. Last,
# those again with glibc told to map every allocation of 64 KiB or more on its own
# (MALLOC_MMAP_THRESHOLD_), so freed tensors leave the RSS at once: peak RSS then
# follows the live tensors rather than what the allocator keeps for reuse.
#   benchmarks/compare_zero_memory.sh [BUILD_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/bench_env.sh"
build=${1:-build}
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
worlds=(2 4) extra=()
if [[ $bench_smoke == 1 ]]; then worlds=(2) extra=(--width 256); fi
for world in "${worlds[@]}"; do
  for mode in ddp zero1 zero2 zero3 zero3-grad-op; do
    "$build/tools/cohort/cohort" run --nproc-per-node "$world" --local-ranks-filter 0 \
      "$build/benchmarks/zero_bench" memory --mode "$mode" "${extra[@]}" | sed 's/^\[rank0\]: //'
  done
done
for threshold in "" 65536; do
  [[ $bench_smoke == 1 && -n $threshold ]] && continue
  for mode in ddp zero1 zero2 zero3 zero3-grad-op; do
    env ${threshold:+MALLOC_MMAP_THRESHOLD_=$threshold} "$build/tools/cohort/cohort" run --nproc-per-node 4 \
      --local-ranks-filter 0 "$build/benchmarks/zero_bench" memory --mode "$mode" --bucket-mib 4 "${extra[@]}" |
      sed "s/^\[rank0\]: {/{\"malloc_mmap_threshold\":\"${threshold:-default}\",/"
  done
done
