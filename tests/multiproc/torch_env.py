"""env:// for a stock PyTorch program, exactly as torchrun's workers do it (the agent's
store, the per-attempt prefix), with the one workaround Debian 13's PyTorch needs."""
import os

import torch.distributed as dist


def init():
    try:
        dist.init_process_group("gloo")
    except RuntimeError as e:
        if "libuv" not in str(e):
            raise
        # Debian 13's PyTorch 2.6 is built without libuv, yet its env:// handler asks
        # for a libuv TCPStore client when TORCHELASTIC_USE_AGENT_STORE is set (under
        # torchrun too). Build the same client from the same contract, without libuv.
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              int(os.environ["WORLD_SIZE"]), is_master=False, use_libuv=False)
        store = dist.PrefixStore(f"/worker/attempt_{os.environ['TORCHELASTIC_RESTART_COUNT']}", store)
        dist.init_process_group("gloo", store=store, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
        print(f"rank {os.environ['RANK']}: env:// needs libuv here; joined without it", flush=True)
