"""Checks a file of `cohort checkpoint consolidate` with PyTorch itself.

usage: check_consolidated.py CONSOLIDATED MODEL_PT STEP

Loads CONSOLIDATED with torch.load(weights_only=True) and requires: its "model" equal,
tensor by tensor, to the checkpoint's own MODEL_PT and loadable into the trainer's
network written in PyTorch; an optimizer state for every parameter, in the order
of model.parameters(), each "momentum_buffer" shaped as its parameter; one
parameter group listing every index; and "step" equal to STEP. Prints one JSON line.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../examples/fashion_mnist"))
from fashion_net import FashionNet  # noqa: E402


def main():
    consolidated, model_pt, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
    state = torch.load(consolidated, weights_only=True)
    assert set(state) == {"model", "optimizer", "step", "epoch"}, sorted(state)
    assert state["step"] == step, (state["step"], step)
    weights = torch.load(model_pt, weights_only=True)
    assert sorted(state["model"]) == sorted(weights), (sorted(state["model"]), sorted(weights))
    for name, tensor in weights.items():
        assert torch.equal(state["model"][name], tensor), name
    model = FashionNet()
    model.load_state_dict(state["model"], strict=True)
    params = list(model.parameters())
    optimizer = state["optimizer"]
    assert sorted(optimizer["state"]) == list(range(len(params))), sorted(optimizer["state"])
    for i, p in enumerate(params):
        buffer = optimizer["state"][i]["momentum_buffer"]
        assert buffer.shape == p.shape, (i, buffer.shape, p.shape)
        assert torch.isfinite(buffer).all() and buffer.abs().sum() > 0, i
    groups = optimizer["param_groups"]
    assert len(groups) == 1 and groups[0]["params"] == list(range(len(params))), groups
    print(json.dumps({"parameters": len(params), "step": state["step"], "lr": float(groups[0]["lr"])}))


if __name__ == "__main__":
    main()
