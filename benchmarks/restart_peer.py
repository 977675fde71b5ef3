"""The peer of restart_worker.cpp under torchrun: the same model and loop with
PyTorch's DDP on Gloo, printing the same JSON line on its first step."""
import json
import os
import sys
import time

started = time.time()
import torch  # noqa: E402  (importing torch is part of a Python worker's start-up)
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402


def ms(t):
    return int(t * 1000)


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    step_ms = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    ready = time.time()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    y = torch.randint(10, (64,))
    for step in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        if step == 0:
            print(json.dumps({"rank": dist.get_rank(), "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
                              "start_ms": ms(started), "ready_ms": ms(ready), "first_step_ms": ms(time.time())},
                             separators=(",", ":")), flush=True)
        time.sleep(step_ms / 1000)


if __name__ == "__main__":
    main()
