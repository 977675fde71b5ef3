"""The peer of examples/fashion_mnist: the same network, data, sampler, optimizer,
schedule and batch, trained with PyTorch's own DistributedDataParallel (Gloo), started
by `cohort run` as torchrun would start it. Rank 0 prints one JSON line with the
training rate (evaluation excluded), as the C++ trainer does.

  trainer_peer.py [--epochs 1] [--batch-size 32] [--lr 2e-3] [--limit-train-batches N] [--data-dir D]
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../examples/fashion_mnist"))
from fashion_net import FashionNet, normalise, read_idx  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--limit-train-batches", type=int, default=0)
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    a = p.parse_args()
    started = time.perf_counter()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    images = torch.from_numpy(read_idx(f"{a.data_dir}/train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28).copy())
    labels = torch.from_numpy(read_idx(f"{a.data_dir}/train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    torch.manual_seed(0)
    model = DistributedDataParallel(FashionNet())
    opt = torch.optim.Adam(model.parameters(), a.lr)
    sampler = DistributedSampler(range(len(labels)), num_replicas=world, rank=rank, seed=0)
    steps_per_epoch = math.ceil(len(sampler) / a.batch_size)
    if a.limit_train_batches:
        steps_per_epoch = min(steps_per_epoch, a.limit_train_batches)
    total, step, samples, train_s = steps_per_epoch * a.epochs, 0, 0, 0.0
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        order = list(sampler)
        mark = time.perf_counter()
        for i in range(steps_per_epoch):
            idx = torch.tensor(order[i * a.batch_size:(i + 1) * a.batch_size])
            x = normalise(images.index_select(0, idx))
            for g in opt.param_groups:
                g["lr"] = a.lr * 0.5 * (1 + math.cos(math.pi * step / total))
            opt.zero_grad()
            loss = F.cross_entropy(model(x), labels.index_select(0, idx))
            loss.backward()
            opt.step()
            loss.item()  # the C++ trainer reads the loss every step too
            step += 1
            samples += len(idx) * world
        train_s += time.perf_counter() - mark
    if rank == 0:
        print(json.dumps({"side": "pytorch", "samples_per_second": samples / train_s, "train_seconds": train_s,
                          "steps": step, "world_size": world, "wall_seconds": time.perf_counter() - started}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
