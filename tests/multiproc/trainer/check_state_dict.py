"""Checks a state dict saved by the C++ trainer with PyTorch itself.

usage: check_state_dict.py SAVED DATA_DIR RESAVED

Loads SAVED with torch.load, requires dict[str, Tensor] with the trainer's names and
shapes, loads it into the same network written in PyTorch, scores the first 1000 test
images, and saves the state dict again with torch.save to RESAVED (which the C++ test
reads back). Prints one JSON line.
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../examples/fashion_mnist"))
from fashion_net import FashionNet, normalise, read_idx  # noqa: E402


def main():
    saved, data_dir, resaved = sys.argv[1:4]
    # weights_only=True: PyTorch's safe loader, the default since 2.6.
    state = torch.load(saved, weights_only=True)
    assert isinstance(state, dict), f"torch.load gave a {type(state).__name__}, not a dict"
    for key, value in state.items():
        assert isinstance(key, str) and isinstance(value, torch.Tensor), f"{key!r}: {type(value).__name__}"
    model = FashionNet()
    model.load_state_dict(state, strict=True)  # names and shapes must match exactly
    model.eval()
    images = read_idx(f"{data_dir}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)[:1000]
    labels = read_idx(f"{data_dir}/t10k-labels-idx1-ubyte.gz", 8)[:1000]
    x = normalise(torch.from_numpy(images.copy()))
    with torch.no_grad():
        predicted = model(x).argmax(1)
    accuracy = (predicted == torch.from_numpy(labels.astype(np.int64))).float().mean().item()
    # A plain dict: C++'s pickle_load cannot read OrderedDict's extra metadata.
    torch.save(dict(model.state_dict()), resaved)
    print(json.dumps({"keys": list(state.keys()), "python_accuracy_first_1000": accuracy}))


if __name__ == "__main__":
    main()
