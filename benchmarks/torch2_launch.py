"""Starting a Gloo job under Debian 13's PyTorch 2.6 torchrun, for the benchmark peers
that run in the chroot (pipeline_peer.py, zero_peer.py).

Debian 13's PyTorch 2.6 is built without libuv, yet its torchrun asks for a libuv
TCPStore (the agent's rendezvous store and the workers' env:// client; plain `torchrun`
there fails with "use_libuv was requested but PyTorch was build without libuv support").
torchrun_without_libuv() makes TCPStore default to use_libuv=False and runs torchrun's
own main() (--standalone) on the script; init_gloo() joins the workers as
tests/multiproc/torch_env.py does.
"""
import os
import sys

import torch.distributed as dist

# The workers join as the tests' stock PyTorch peers do (env://, or its libuv-free twin).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "multiproc"))
from torch_env import init as init_gloo  # noqa: E402,F401


def without_libuv():
    """TCPStore with use_libuv=False wherever torchrun's agent makes one."""
    import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend as c10d_backend
    import torch.distributed.elastic.rendezvous.static_tcp_rendezvous as static_backend

    class TCPStore(dist.TCPStore):
        def __init__(self, *args, **kwargs):
            kwargs["use_libuv"] = False
            super().__init__(*args, **kwargs)

    dist.TCPStore = c10d_backend.TCPStore = static_backend.TCPStore = TCPStore


def torchrun_without_libuv(script):
    """`--torchrun P [flags]`: torchrun --standalone --nproc-per-node P script [flags]."""
    from torch.distributed.run import main as torchrun

    without_libuv()
    nproc = sys.argv[2]
    sys.argv = ["torchrun", "--standalone", "--nproc-per-node", nproc, script] + sys.argv[3:]
    return torchrun()
