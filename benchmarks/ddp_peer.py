"""The peer of ddp_bench.cpp: the same models, step and protocol through PyTorch's own
DistributedDataParallel (Gloo; NCCL with --device cuda), started by `cohort run` exactly as torchrun would start
it (env:// rendezvous on the launcher's store). Rank 0 prints one JSON line per result.

  ddp_peer.py throughput [--model mlp|cnn|deep|wide|all] [--mode local|ddp|ddp-view] [--steps K] [--reps R]
                         [--warmup W] [--device cpu|cuda]
  ddp_peer.py memory --mode local|ddp|ddp-view [--model deep] [--steps N] [--warmup W]

The models must match bench_models.h, parameter for parameter and in the same order.
"""
import argparse
import json
import sys
import os
import re
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

CLASSES = 10
# name: (one sample's shape, batch, steps per repetition, bucket cap in MB), as in bench_models.h
SPECS = {
    "mlp": ((784,), 64, 30, 25),
    "cnn": ((1, 28, 28), 32, 60, 25),
    "deep": ((256,), 16, 15, 1),
}
DEEP_BLOCKS, DEEP_WIDTH = 24, 256
# Not in "all" (as in bench_models.h): a model to keep a GPU busy.
WIDE = ((2048,), 512, 20, 25)
WIDE_LAYERS, WIDE_WIDTH = 6, 2048


def make_model(name):
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, CLASSES))
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(32 * 7 * 7, CLASSES))
    layers = []
    if name == "wide":
        for _ in range(WIDE_LAYERS):
            layers += [nn.Linear(WIDE_WIDTH, WIDE_WIDTH), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(WIDE_WIDTH, CLASSES))
    for _ in range(DEEP_BLOCKS):
        layers += [nn.Linear(DEEP_WIDTH, DEEP_WIDTH), nn.LayerNorm(DEEP_WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(DEEP_WIDTH, CLASSES))


def spec(name):
    return WIDE if name == "wide" else SPECS[name]


class Trainer:
    """A model, its optimizer and its batch (made once, reused), with or without DDP."""

    def __init__(self, name, mode, device="cpu"):
        shape, batch, _, cap_mb = spec(name)
        self.model = make_model(name).to(device)
        self.forward = self.model
        if mode != "local":
            self.forward = DistributedDataParallel(self.model, bucket_cap_mb=cap_mb,
                                                   gradient_as_bucket_view=(mode == "ddp-view"))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        torch.manual_seed(1000 + dist.get_rank())
        self.input = torch.randn(batch, *shape).to(device)
        self.target = torch.randint(CLASSES, (batch,)).to(device)

    def step(self):
        self.optimizer.zero_grad(set_to_none=False)  # LibTorch 1.13's zero_grad() zeroes
        F.cross_entropy(self.forward(self.input), self.target).backward()
        self.optimizer.step()


def throughput(args):
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{torch.cuda.current_device()}" if args.device == "cuda" else "cpu"

    def finish():  # work queued on the GPU counts in the step that queued it
        if args.device == "cuda":
            torch.cuda.synchronize()

    for name in SPECS if args.model == "all" else [args.model]:
        trainer = Trainer(name, args.mode, device)
        shape, batch, default_steps, cap_mb = spec(name)
        steps = args.steps or default_steps
        for _ in range(args.warmup):
            trainer.step()
        finish()
        rates, cpu_ms = [], []
        for _ in range(args.reps):
            dist.barrier()
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(steps):
                trainer.step()
            finish()
            rates.append(steps / (time.perf_counter() - start))
            cpu_ms.append((time.process_time() - cpu_start) * 1e3 / steps)
        if rank != 0:
            continue
        rates.sort()
        cpu_ms.sort()
        line = {"impl": "torch-local" if args.mode == "local" else "torch-" + args.mode, "model": name,
                "world": world, "device": device, "batch": batch, "steps": steps, "reps": args.reps, "bucket_cap_mb": cap_mb}
        if args.mode != "local":
            logged = trainer.forward._get_ddp_logging_data()  # buckets are rebuilt after the first step
            line["buckets"] = len((logged.get("rebuilt_bucket_sizes") or logged["bucket_sizes"]).split(","))
        line.update(steps_per_s=round(rates[len(rates) // 2], 2), min=round(rates[0], 2), max=round(rates[-1], 2),
                    cpu_ms_per_step=round(cpu_ms[len(cpu_ms) // 2], 3))
        print(json.dumps(line), flush=True)


def status_mb(key):
    with open("/proc/self/status") as status:
        return int(re.search(rf"^{key}:\s+(\d+) kB", status.read(), re.M).group(1)) / 1024


def memory(args):
    trainer = Trainer(args.model, args.mode)
    for _ in range(args.warmup):
        trainer.step()
    warmup_peak = status_mb("VmHWM")
    try:  # resets VmHWM to the current RSS, see proc(5)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    for _ in range(args.steps):
        trainer.step()
    steady_peak = status_mb("VmHWM")
    if dist.get_rank() != 0:
        return
    grad_mb = sum(p.numel() * p.element_size() for p in trainer.model.parameters()) / 2**20
    print(json.dumps({"impl": "torch", "kind": "memory", "config": args.mode, "model": args.model,
                      "world": dist.get_world_size(), "grad_mb": round(grad_mb, 2),
                      "peak_mb": round(max(warmup_peak, steady_peak), 2),
                      "steady_peak_mb": round(steady_peak, 2) if reset else None,
                      "rss_mb": round(status_mb("VmRSS"), 2)}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["throughput", "memory"])
    parser.add_argument("--model", choices=[*SPECS, "wide", "all"])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--mode", choices=["local", "ddp", "ddp-view"], default="ddp")
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    args.model = args.model or ("all" if args.command == "throughput" else "deep")
    if args.command == "memory":
        args.steps = args.steps or 30
        if args.model == "all":
            parser.error("memory takes one model")
    torch.set_num_threads(1)
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    throughput(args) if args.command == "throughput" else memory(args)
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
