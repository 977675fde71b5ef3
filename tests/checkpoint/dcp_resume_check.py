"""PyTorch's side of the resume round trips of tests/checkpoint/dcp_convert_test.cpp
(issue 49), on PyTorch 2 (the PyPI 2.11 tree's venv):

  dcp_resume_check.py save OUT --world N --steps K [--fsdp]
      trains the MLP K steps from scratch at world N (FSDP2's fully_shard with --fsdp,
      DDP otherwise) and writes OUT/step-K with dcp.save, as torchtitan lays out its
      checkpoints: {"model", "optim"} of get_state_dict, and {"train": {"step": K}}.
  dcp_resume_check.py resume CKPT RESULT.json --world N --steps K [--fsdp]
      loads the distributed checkpoint CKPT with dcp.load at world N, trains K more
      steps and writes the full weights and Adam's state as JSON (what
      dcp_resume_worker.cpp writes for cohort).

The global batch of step s is batch(s), 6 rows; each of the N ranks takes its 6/N.
Processes meet through a file store, so no port is used (gloo_ranks.py).
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gloo_ranks import run_ranks  # noqa: E402

ROWS = 6


def batch(step):
    f = 0.1 * (step + 1)
    x = torch.sin(torch.arange(ROWS * 5, dtype=torch.float32) * f).reshape(ROWS, 5)
    y = torch.cos(torch.arange(ROWS * 3, dtype=torch.float32) * (2 * f)).reshape(ROWS, 3)
    return x, y


def make(fsdp, world, seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    if fsdp:
        from torch.distributed.fsdp import fully_shard
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
    elif world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def train(model, opt, first, steps, rank, world):
    share = ROWS // world
    for step in range(first, first + steps):
        x, y = batch(step)
        mine = slice(rank * share, (rank + 1) * share)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        opt.step()


def flat(t):
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    return t.detach().double().flatten().tolist()


def work(rank, a):
    if a.mode == "save":
        model, opt = make(a.fsdp, a.world, 0)
        train(model, opt, 0, a.steps, rank, a.world)
        model_sd, optim_sd = get_state_dict(model, opt)
        dcp.save({"model": model_sd, "optim": optim_sd, "train": {"step": a.steps}},
                 checkpoint_id=os.path.join(a.path, f"step-{a.steps}"))
        if rank == 0:
            print(f"saved step {a.steps} at world {a.world}", flush=True)
        return
    model, opt = make(a.fsdp, a.world, 123)
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "train": {"step": -1}}
    dcp.load(state, checkpoint_id=a.path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    first = state["train"]["step"]
    train(model, opt, first, a.steps, rank, a.world)
    full_model, full_optim = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    if rank == 0:
        result = {"step": first + a.steps}
        for name, t in full_model.items():
            result[f"model.{name}"] = flat(t)
        for name, fields in full_optim["state"].items():
            result[f"optim.{name}.exp_avg"] = flat(fields["exp_avg"])
            result[f"optim.{name}.exp_avg_sq"] = flat(fields["exp_avg_sq"])
            result[f"optim.{name}.step"] = int(flat(fields["step"])[0])
        with open(a.result, "w") as f:
            json.dump(result, f)
        print(f"resumed step {first} at world {a.world}, trained to {first + a.steps}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["save", "resume"])
    p.add_argument("path")
    p.add_argument("result", nargs="?")
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--fsdp", action="store_true")
    a = p.parse_args()
    if a.mode == "resume" and not a.result:
        p.error("resume needs RESULT.json")
    run_ranks(work, a.world, a)  # Note [PyTorch's Gloo teardown] in gloo_ranks.py


if __name__ == "__main__":
    sys.exit(main())
