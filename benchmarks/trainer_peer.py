"""The peer of examples/fashion_mnist: the same network, data, sampler, optimizer,
schedule and batch, trained with PyTorch's own DistributedDataParallel (Gloo), started
by `cohort run` as torchrun would start it. Rank 0 prints one JSON line with the
training rate (evaluation excluded), as the C++ trainer does.

  trainer_peer.py [--epochs 1] [--batch-size 32] [--lr 2e-3] [--limit-train-batches N] [--data-dir D]
                  [--memory-format channels-last|contiguous] [--evaluate] [--device cpu|cuda]
                  [--checkpoint-dir DIR --checkpoint-every N --checkpoint-mode none|sync|async]

With --device cuda, each rank trains on its local GPU over NCCL, with its batches
copied there each step from the images held on the CPU, as the C++ trainer does.

With --evaluate, every epoch ends with a distributed evaluation on the test set and
rank 0 prints "epoch E/N: test accuracy A, ..., S s since start" as the C++ trainer does.

With --checkpoint-mode sync|async (issue 49's benchmark against PyTorch's distributed
checkpoints), every --checkpoint-every N optimizer steps the model and the optimizer
are saved with torch.distributed.checkpoint to DIR/step-S (class Checkpointer). The
saves happen inside the training loop, so the training rate includes the time they
block it; the JSON line gains checkpoints, checkpoint_blocked_ms_median/_max (rank 0's
time blocked per save, the wait for the previous async save included),
checkpoint_final_wait_ms (the wait for the last async save, after the loop),
rss_mb_start/_end (rank 0's RSS at the first save and after the last) and
checkpoint_mode. With none (the default) nothing changes, on torch 1.13 too.
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

from dcp_checkpointer import Checkpointer  # noqa: E402  (beside this script)


def evaluate(model, x, y, rank, world, fmt):
    """Each rank scores a contiguous slice of the test set; the counts are summed."""
    begin, end = len(y) * rank // world, len(y) * (rank + 1) // world
    correct = 0
    with torch.no_grad():
        for first in range(begin, end, 1000):
            last = min(first + 1000, end)
            correct += int((model(x[first:last].contiguous(memory_format=fmt)).argmax(1) == y[first:last]).sum())
    counts = torch.tensor([correct, end - begin], dtype=torch.float64, device=y.device)
    dist.all_reduce(counts)
    return float(counts[0] / counts[1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--limit-train-batches", type=int, default=0)
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--memory-format", default="channels-last", choices=["channels-last", "contiguous"])
    p.add_argument("--evaluate", action="store_true")
    p.add_argument("--amp", default="off", choices=["bf16", "off"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--checkpoint-dir", default="")
    p.add_argument("--checkpoint-every", type=int, default=0, help="optimizer steps between checkpoints")
    p.add_argument("--checkpoint-mode", default="none", choices=["none", "sync", "async"])
    a = p.parse_args()
    fmt = torch.channels_last if a.memory_format == "channels-last" else torch.contiguous_format
    started = time.perf_counter()
    device = "cpu"
    if a.device == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    checkpointer = Checkpointer(a.checkpoint_dir, a.checkpoint_every, a.checkpoint_mode, rank)
    images = torch.from_numpy(read_idx(f"{a.data_dir}/train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28).copy())
    labels = torch.from_numpy(read_idx(f"{a.data_dir}/train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    torch.manual_seed(0)
    model = DistributedDataParallel(FashionNet().to(device, memory_format=fmt))
    if a.evaluate:
        test_x = normalise(torch.from_numpy(
            read_idx(f"{a.data_dir}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28).copy()))
        test_y = torch.from_numpy(read_idx(f"{a.data_dir}/t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))
        test_x, test_y = test_x.to(device), test_y.to(device)
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
            x = normalise(images.index_select(0, idx)).contiguous(memory_format=fmt).to(device)
            for g in opt.param_groups:
                g["lr"] = a.lr * 0.5 * (1 + math.cos(math.pi * step / total))
            opt.zero_grad()
            with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.amp == "bf16"):
                loss = F.cross_entropy(model(x), labels.index_select(0, idx).to(device))
            loss.backward()
            opt.step()
            loss.item()  # the C++ trainer reads the loss every step too
            step += 1
            samples += len(idx) * world
            checkpointer.step(step, model, opt)
        train_s += time.perf_counter() - mark
        if a.evaluate:
            accuracy = evaluate(model.module, test_x, test_y, rank, world, fmt)
            if rank == 0:
                print(f"epoch {epoch + 1}/{a.epochs}: test accuracy {accuracy:.4f}, "
                      f"{time.perf_counter() - started:.1f} s since start", flush=True)
    checkpoint_keys = checkpointer.finish()
    if rank == 0:
        print(json.dumps({"side": "pytorch", "samples_per_second": samples / train_s, "train_seconds": train_s,
                          "steps": step, "world_size": world, "wall_seconds": time.perf_counter() - started,
                          **checkpoint_keys}))
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
