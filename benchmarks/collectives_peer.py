"""The peer of collectives_compare.cpp: the same all-reduce protocol through
PyTorch's own torch.distributed (Gloo), started by `cohort run` exactly as torchrun
would start it (env:// rendezvous on the launcher's store)."""
import json
import time

import torch
import torch.distributed as dist

SIZES = [(1, 400), (1024, 400), (32768, 100), (1048576, 20)]
WARMUP = 20
REPETITIONS = 7


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for numel, calls in SIZES:
        t = torch.ones(numel)
        for _ in range(WARMUP):
            dist.all_reduce(t)
        means = []
        for _ in range(REPETITIONS):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(t)
            means.append((time.perf_counter() - start) * 1e6 / calls)
        means.sort()
        if rank == 0:
            print(json.dumps({"impl": "torch.distributed", "op": "all_reduce", "world": world, "numel": numel,
                              "median_us": round(means[REPETITIONS // 2], 1), "min_us": round(means[0], 1),
                              "max_us": round(means[-1], 1)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
