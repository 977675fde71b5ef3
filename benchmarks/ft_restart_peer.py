"""The peer of ft_bench_worker.cpp's plain mode under torchrun: the same MLP, SGD
with momentum and global batch, PyTorch's DDP on Gloo, the same simulated checkpoint
(rank 0 writes the next step's number to FILE after every 10th step; a restarted job
starts from it and loads nothing else) and the same JSON line per step. Each rank
takes a contiguous part of the step's global batch, as StepSampler does, from a
fixed order rather than a shuffled one.
  ft_restart_peer.py [--steps N] [--features F] [--hidden H] [--global-batch B]
                     [--log-steps] [--checkpoint FILE]"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

DATASET = 8192
CLASSES = 10
CHECKPOINT_EVERY = 10


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000000)
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--log-steps", action="store_true")
    parser.add_argument("--checkpoint", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    torch.manual_seed(0)
    inputs = torch.randn(DATASET, args.features)
    labels = inputs.matmul(torch.randn(args.features, CLASSES)).argmax(1)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(args.features, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden),
                          nn.ReLU(), nn.Linear(args.hidden, CLASSES))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    first = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        first = int(open(args.checkpoint).read())
    begin = rank * args.global_batch // size
    end = (rank + 1) * args.global_batch // size
    for step in range(first, args.steps):
        index = (torch.arange(begin, end) + step * args.global_batch) % DATASET
        loss = nn.functional.cross_entropy(ddp(inputs[index]), labels[index]) * ((end - begin) * size /
                                                                                 args.global_batch)
        optimizer.zero_grad()
        loss.backward()  # a peer's death ends the process
        optimizer.step()
        if args.log_steps:
            print(json.dumps({"rank": rank, "inc": restart, "step": step, "ms": int(time.time() * 1000),
                              "committed": True, "quorum": restart, "size": size}, separators=(",", ":")),
                  flush=True)
        if args.checkpoint and rank == 0 and (step + 1) % CHECKPOINT_EVERY == 0:
            with open(args.checkpoint + ".tmp", "w") as f:
                f.write("%d\n" % (step + 1))
            os.replace(args.checkpoint + ".tmp", args.checkpoint)


if __name__ == "__main__":
    main()
