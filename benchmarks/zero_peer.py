"""The peer of zero_bench.cpp's `throughput`: the same model, optimizer, batch and
protocol through PyTorch's own DDP, ZeroRedundancyOptimizer and FSDP (Gloo, one
thread per rank), started by `cohort run` (PyTorch 1.13) or by torch.distributed.run
in the Debian 13 chroot (PyTorch 2.6: 1.13's FSDP does not import under Python 3.11).
Rank 0 prints one JSON line.

  zero_peer.py [--torchrun P] --mode ddp|zero1|fsdp-grad-op|fsdp-full [--width W] [--layers L] [--batch N]
               [--steps K] [--reps R] [--warmup U] [--bucket-mib B]

zero1 is DDP with ZeroRedundancyOptimizer around Adam (ZeRO-1); fsdp-grad-op is FSDP's
SHARD_GRAD_OP (ZeRO-2: gradients and optimizer state sharded) and fsdp-full its
FULL_SHARD (ZeRO-3: parameters too), each over the whole model as one unit.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from torch2_launch import init_gloo, torchrun_without_libuv  # beside this file


def make_model(width, layers):
    torch.manual_seed(0)
    modules = []
    for i in range(layers):
        modules.append(nn.Linear(width, width))
        if i + 1 < layers:
            modules.append(nn.ReLU())
    return nn.Sequential(*modules)


def setup(args):
    model = make_model(args.width, args.layers)
    parameters = sum(p.numel() for p in model.parameters())
    if args.mode in ("ddp", "zero1"):
        wrapped = DistributedDataParallel(model, bucket_cap_mb=args.bucket_mib, gradient_as_bucket_view=True)
        if args.mode == "ddp":
            optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-4)
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            optimizer = ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4)
        return wrapped, optimizer, parameters
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    strategy = ShardingStrategy.SHARD_GRAD_OP if args.mode == "fsdp-grad-op" else ShardingStrategy.FULL_SHARD
    wrapped = FullyShardedDataParallel(model, sharding_strategy=strategy, device_id=torch.device("cpu"))
    return wrapped, torch.optim.Adam(wrapped.parameters(), lr=1e-4), parameters


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--torchrun":  # in the chroot (torch2_launch.py)
        return torchrun_without_libuv(__file__)
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["ddp", "zero1", "fsdp-grad-op", "fsdp-full"], default="ddp")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--bucket-mib", type=int, default=25)
    args = parser.parse_args()
    torch.set_num_threads(1)
    init_gloo()
    model, optimizer, parameters = setup(args)
    x = torch.randn(args.batch, args.width)

    def step():
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    ms = []
    for _ in range(args.reps):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        t = torch.tensor([(time.perf_counter() - start) * 1000.0 / args.steps], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ms.append(t.item())
    if dist.get_rank() == 0:
        ms.sort()
        median = ms[len(ms) // 2]
        print(json.dumps({"peer": "pytorch " + torch.__version__, "mode": args.mode, "world": dist.get_world_size(),
                          "parameters_million": parameters / 1e6, "batch_per_rank": args.batch,
                          "steps_per_rep": args.steps, "reps": args.reps, "step_ms_median": median,
                          "step_ms_min": ms[0], "step_ms_max": ms[-1],
                          "samples_per_s": args.batch * dist.get_world_size() * 1000.0 / median}), flush=True)
    dist.barrier()  # PyTorch 1.13: a rank that tears down while another prints can hang it
    dist.destroy_process_group()
    # Note [PyTorch 1.13's exit deadlock]: tearing down a DDP model at exit can hang
    # for ever in 1.13 (~Reducer destroys the Gloo group, whose work thread waits
    # for the GIL while holding the mutex the destructor wants; seen in CI's
    # benchmark smoke run). Everything is printed and the group destroyed by now,
    # so leave without destructors (the model is still alive here, on purpose).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
