"""A stock PyTorch program, unaware of cohort: env:// rendezvous, Gloo, all_reduce.
`cohort run` must start it exactly as torchrun would (agent store, per-attempt prefix)."""
import os

import torch
import torch.distributed as dist

from torch_env import init

init()
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"torch.distributed rank {rank} of {world}: {t.item():.0f}", flush=True)
dist.destroy_process_group()
