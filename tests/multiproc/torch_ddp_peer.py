"""Stock PyTorch DDP, unaware of cohort: a small model trained for a few steps on
data that differs by rank; rank 0 prints the final weights in full precision, so
that two launches can be compared."""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from torch_env import init

init()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(100 + rank)
for step in range(5):
    x = torch.randn(32, 8, generator=data)
    y = torch.randn(32, 2, generator=data)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
if rank == 0:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    print("final weights " + " ".join(f"{v:.9e}" for v in flat.tolist()), flush=True)
dist.destroy_process_group()
# Note [PyTorch 1.13's exit deadlock]: tearing down a DDP model at exit can hang
# for ever in 1.13 (~Reducer destroys the Gloo group, whose work thread waits
# for the GIL while holding the mutex the destructor wants; seen in CI's
# benchmark smoke run). Everything is printed and the group destroyed by now,
# so leave without destructors.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
