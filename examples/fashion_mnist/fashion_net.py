"""The trainer's network in PyTorch, parameter for parameter (model.h), and the
dataset's normalisation, for Python code that reads the trainer's weights:

    import sys; sys.path.insert(0, "examples/fashion_mnist")
    from fashion_net import FashionNet
    model = FashionNet()
    model.load_state_dict(torch.load("build/fashion_mnist_run/final.pt", weights_only=True))
"""
import gzip

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530  # FashionMnist::kMean, kStd


class FashionNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        # Pooling before ReLU: the same function, cheaper (Note [Pool, then ReLU]).
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def read_idx(path, header):
    """The elements of a gzipped IDX file of unsigned bytes (header: 16 for images, 8 for labels)."""
    with gzip.open(path) as f:
        return np.frombuffer(f.read()[header:], np.uint8)


def normalise(images):
    """uint8 images [N, 28, 28] -> float [N, 1, 28, 28], as the C++ dataset does."""
    return (images.unsqueeze(1).float() / 255.0 - MEAN) / STD
