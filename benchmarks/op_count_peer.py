"""The peer of op_count.cpp: operators dispatched per training step in PyTorch, with the
same models, batches and step (the optimizer's zero_grad with its defaults, forward,
cross entropy, backward, torch.optim.Adam with its defaults: foreach=None, fused=None,
which on the CPU is the for-loop), counted through PyTorch's profiler. Started by
`cohort run` like a torchrun worker; --mode ddp wraps the model in PyTorch's
DistributedDataParallel over Gloo. Rank 0 prints one JSON line per model.

  op_count_peer.py [--model fashion|mlp|cnn|deep|all] [--mode local|ddp] [--steps N] [--warmup W]

Note [What counts as an operator] in op_count.cpp: the profiler's events of scope
FUNCTION that name an operator ("namespace::name"), on every thread that it records
(the autograd engine carries the profiler to its threads). That leaves out the
engine's "autograd::engine::evaluate_function: X" wrappers, c10d's
"record_param_comms" annotations, the autograd nodes (BACKWARD_FUNCTION) and the
record_function annotations of torch.optim and DDP (USER_SCOPE), as op_count.cpp's
filter does. Python code itself is not a RecordFunction event.
"""
import argparse
import contextlib
import json
import os
import re
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "examples", "fashion_mnist"))
import ddp_peer  # noqa: E402  (bench_models.h's models)
from fashion_net import FashionNet  # noqa: E402  (the trainer's network, model.h)

FUNCTION_SCOPE = 0  # at::RecordScope::FUNCTION
OPERATOR = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_][\w.]*$")
PHASES = ("zero_grad", "forward", "backward", "step")
# name: (one sample's shape, batch, bucket cap in MB), as op_count.cpp's
SPECS = {"fashion": ((1, 28, 28), 32, 25)}
SPECS.update({name: (shape, batch, cap) for name, (shape, batch, _, cap) in ddp_peer.SPECS.items()})


def counted(event):
    return event.scope == FUNCTION_SCOPE and OPERATOR.match(event.name) is not None


def profiled(fn):
    """fn's result and (operators, top-level operators) counted in one profiler session
    around it."""
    with torch.autograd.profiler.profile() as prof:
        result = fn()
    ops = [e for e in prof.function_events if counted(e)]

    def top_level(e):
        parent = e.cpu_parent
        while parent is not None:
            if counted(parent):
                return False
            parent = parent.cpu_parent
        return True

    counts = (len(ops), sum(top_level(e) for e in ops))
    return result, counts


def count(name, args):
    shape, batch, cap_mb = SPECS[name]
    torch.manual_seed(0)
    model = FashionNet() if name == "fashion" else ddp_peer.make_model(name)
    forward = DistributedDataParallel(model, bucket_cap_mb=cap_mb) if args.mode == "ddp" else model
    optimizer = torch.optim.Adam(model.parameters())
    torch.manual_seed(1000 + dist.get_rank())
    data, target = torch.randn(batch, *shape), torch.randint(ddp_peer.CLASSES, (batch,))

    def zero_grad():
        optimizer.zero_grad()

    def forward_loss():
        return F.cross_entropy(forward(data), target)

    for _ in range(args.warmup):
        zero_grad()
        forward_loss().backward()
        optimizer.step()
    dist.barrier()
    # Each phase runs in a profiler session of its own, so that the counts need no
    # annotations: on 1.13, record_function dispatches an aten::zeros for its handle.
    totals = dict.fromkeys(PHASES, 0)
    top = 0
    for _ in range(args.steps):
        _, ops = profiled(zero_grad)
        loss, ops_forward = profiled(forward_loss)
        _, ops_backward = profiled(loss.backward)
        _, ops_step = profiled(optimizer.step)
        for phase, counts in zip(PHASES, (ops, ops_forward, ops_backward, ops_step)):
            totals[phase] += counts[0]
            top += counts[1]
    if dist.get_rank() != 0:
        return
    per_step = lambda n: n / args.steps  # noqa: E731
    line = {"impl": "pytorch", "torch": torch.__version__.split("+")[0], "model": name, "optimizer": "torch.optim.Adam",
            "kernel": "for-loop", "mode": args.mode, "world": dist.get_world_size(), "batch": batch,
            "steps": args.steps, "ops_per_step": per_step(sum(totals.values())), "top_level_per_step": per_step(top)}
    line.update({p: per_step(totals[p]) for p in PHASES})
    print(json.dumps(line), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="all", choices=["all", *SPECS])
    parser.add_argument("--mode", default="local", choices=["local", "ddp"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    for name in SPECS if args.model == "all" else [args.model]:
        count(name, args)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
