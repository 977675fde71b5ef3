"""Loads a PyTorch distributed checkpoint that `cohort checkpoint convert --to dcp`
wrote with PyTorch's own torch.distributed.checkpoint.load, and checks that the model
and the optimizer state equal what cohort saved (its `cohort checkpoint consolidate`
file, read with torch.load). Run by tests/checkpoint/dcp_convert_test.cpp on PyTorch 2.

  dcp_load_check.py DCP_DIR CONSOLIDATED.pt --world N [--fsdp] [--optimizer adam|adamw|sgd]

The model is the test's MLP: Linear(5, 8), ReLU, Linear(8, 3), with keys 0.* and 2.*.
World 1 loads into a plain module. World N > 1 starts N processes over Gloo (a file
store, no port) and, with --fsdp, shards the module with FSDP2's fully_shard first,
so that each rank loads only its rows of each tensor: dcp.load reshards the
checkpoint's whole chunks. Every rank then gathers the full state dict and compares.
Prints "ok: ..." on success; exits 1 naming the first difference.
"""
import argparse
import os
import sys

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gloo_ranks import run_ranks  # noqa: E402


def make(optimizer, fsdp):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    if fsdp:
        # Sharded before the optimizer is made, as FSDP2 wants: its parameters are
        # the DTensors each rank holds a row block of.
        from torch.distributed.fsdp import fully_shard
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.1)
    elif optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=0.5)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=0.5)
    # One step, so that the optimizer has state for dcp.load to fill (its values are
    # overwritten by the load; a wrong load shows).
    model(torch.randn(2, 5)).sum().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def compare(name, got, expected):
    if isinstance(expected, torch.Tensor):
        got_t = got if isinstance(got, torch.Tensor) else torch.tensor(got)
        if got_t.shape != expected.shape or not torch.equal(got_t.to(expected.dtype), expected):
            raise SystemExit(f"{name}: {got!r} != {expected!r}")
    elif isinstance(expected, (tuple, list)):
        if len(got) != len(expected):
            raise SystemExit(f"{name}: {got!r} != {expected!r}")
        for i, (g, e) in enumerate(zip(got, expected)):
            compare(f"{name}[{i}]", g, e)
    elif got != expected:
        raise SystemExit(f"{name}: {got!r} != {expected!r}")


def check(a, rank, world):
    model, opt = make(a.optimizer, a.fsdp)
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "train": {"step": -1, "epoch": -1}}
    dcp.load(state, checkpoint_id=a.dcp_dir)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    full_model, full_optim = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))

    expected = torch.load(a.consolidated, weights_only=True)
    names = list(expected["model"].keys())
    for key, tensor in expected["model"].items():
        compare(f"model.{key}", full_model[key], tensor)
    for index, fields in expected["optimizer"]["state"].items():
        name = names[index]
        for field, value in fields.items():
            got = full_optim["state"][name][field]
            # cohort keeps Adam's step as an int, PyTorch as a float32 tensor
            compare(f"optim.state.{name}.{field}", got, value if isinstance(value, torch.Tensor) else torch.tensor(float(value)))
    for g, group in enumerate(expected["optimizer"]["param_groups"]):
        for option, value in group.items():
            if option == "params":
                compare(f"param_groups.{g}.params", full_optim["param_groups"][g]["params"], [names[i] for i in value])
                continue
            # floats travel as 0-d float64 tensors in the consolidated file
            want = value.item() if isinstance(value, torch.Tensor) else value
            if isinstance(want, tuple):
                want = tuple(v.item() if isinstance(v, torch.Tensor) else v for v in want)
            compare(f"param_groups.{g}.{option}", full_optim["param_groups"][g][option], want)
    if state["train"]["step"] != expected["step"] or state["train"]["epoch"] != expected["epoch"]:
        raise SystemExit(f"train: {state['train']} != step {expected['step']}, epoch {expected['epoch']}")
    return len(full_model), sum(len(f) for f in full_optim["state"].values())


def worker(rank, a):
    tensors, fields = check(a, rank, a.world)
    if rank == 0:
        print(f"ok: world {a.world}{' fsdp' if a.fsdp else ''}: {tensors} model tensors and {fields} optimizer "
              f"fields equal cohort's", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dcp_dir")
    p.add_argument("consolidated")
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--optimizer", default="adam", choices=["adam", "adamw", "sgd"])
    a = p.parse_args()
    if a.world == 1 and not a.fsdp:
        tensors, fields = check(a, 0, 1)
        print(f"ok: world 1: {tensors} model tensors and {fields} optimizer fields equal cohort's", flush=True)
        return
    run_ranks(worker, a.world, a)  # Note [PyTorch's Gloo teardown] in gloo_ranks.py


if __name__ == "__main__":
    sys.exit(main())
