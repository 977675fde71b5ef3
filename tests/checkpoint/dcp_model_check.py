"""Loads the model of a distributed checkpoint with PyTorch's own dcp.load (one
process) into the shapes of a state dict that torch.load reads, and checks that every
tensor equals it. Run by tests/checkpoint/dcp_convert_test.cpp on PyTorch 2:

  dcp_model_check.py DCP_DIR FINAL.pt

DCP_DIR is a step-N directory a cohort trainer wrote with --checkpoint-format dcp;
FINAL.pt its --save-final file of the same step, or the file `cohort checkpoint
consolidate` made of it (its "model"). Prints "ok: N tensors"; exits 1
naming the first difference.
"""
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp


def main():
    ckpt, final = sys.argv[1], sys.argv[2]
    expected = torch.load(final, weights_only=True)
    if isinstance(expected.get("model"), dict):  # `cohort checkpoint consolidate`'s file
        expected = expected["model"]
    state = {"model": {k: torch.full_like(v, float("nan")) for k, v in expected.items()}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
        dcp.load(state, checkpoint_id=ckpt)
    for k, v in expected.items():
        if not torch.equal(state["model"][k], v):
            raise SystemExit(f"model.{k}: dcp.load gives {state['model'][k]!r}, the trainer saved {v!r}")
    print(f"ok: {len(expected)} tensors", flush=True)


if __name__ == "__main__":
    main()
