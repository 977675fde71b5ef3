"""Reference checkpoints in PyTorch's distributed checkpoint format (torch.distributed.
checkpoint, "DCP"), for docs/dcp_format.md and for a future C++ reader and writer
(issue 49). Not part of the test suite: run it by hand on PyTorch 2.x (the format
documented is torch 2.11.0's; scripts/pypi-torch --venv-only 2.11.0 makes a venv).

  python dcp_reference.py OUT          writes OUT/world1, OUT/world2-ddp, OUT/world2-fsdp2
                                       (2 processes on Gloo through torch.distributed.run)
                                       and checks that each loads back (FSDP2's at world 1 too)
  python dcp_reference.py --dump CKPT  prints CKPT/.metadata field by field, the
                                       pickletools disassembly of it, and where each item
                                       lies in the .distcp files (and whether LibTorch's
                                       torch::pickle_load, through torch._C, reads it as
                                       torch.load does)

Each checkpoint is dcp.save({"model": ..., "optim": ..., "train": {"step": 7}}) of a
2-layer MLP, Linear(5, 8) - ReLU - Linear(8, 3), trained one Adam step, the model and
optimizer state taken with torch.distributed.checkpoint.state_dict.get_state_dict:
  world1       one process (a world-1 Gloo group)
  world2-ddp   two processes, the model in DistributedDataParallel (replicated: DCP
               writes each tensor once, spread over the ranks)
  world2-fsdp2 two processes, torch.distributed.fsdp.fully_shard on the CPU (every
               parameter and Adam state a DTensor sharded on dim 0: 8 rows as 4 + 4,
               3 rows as 2 + 1)
"""
import io
import os
import pickle
import pickletools
import subprocess
import sys
import zipfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))


def train_one_step(model, opt):
    torch.manual_seed(1)
    x, y = torch.randn(6, 5), torch.randn(6, 3)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def state(model, opt):
    model_sd, optim_sd = get_state_dict(model, opt)
    return {"model": model_sd, "optim": optim_sd, "train": {"step": 7}}


def save(kind, out):
    rank = dist.get_rank()
    model = make_model()
    if kind == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    elif kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    train_one_step(model, opt)
    dcp.save(state(model, opt), checkpoint_id=out)
    # Load it back into a fresh model and optimizer of the same kind.
    model2 = make_model()
    if kind == "ddp":
        model2 = nn.parallel.DistributedDataParallel(model2)
    elif kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in (model2[0], model2[2]):
            fully_shard(layer)
        fully_shard(model2)
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.5)
    train_one_step(model2, opt2)  # so that the optimizer has state to load into
    target = state(model2, opt2)
    target["train"]["step"] = 0
    dcp.load(target, checkpoint_id=out)
    set_state_dict(model2, opt2, model_state_dict=target["model"], optim_state_dict=target["optim"])
    for (n, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        a = a.full_tensor() if hasattr(a, "full_tensor") else a
        b = b.full_tensor() if hasattr(b, "full_tensor") else b
        assert torch.equal(a, b), n
    assert target["train"]["step"] == 7 and opt2.param_groups[0]["lr"] == 0.01
    if rank == 0:
        print(f"dcp_reference: {out}: saved and loaded back at world {dist.get_world_size()}", flush=True)


def load_at_world1(path):
    """A world-2 checkpoint into a plain world-1 model: DCP reshards on load."""
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.5)
    train_one_step(model, opt)
    target = state(model, opt)
    dcp.load(target, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=target["model"], optim_state_dict=target["optim"])
    reference = make_model()
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    train_one_step(reference, ref_opt)
    for (n, a), b in zip(reference.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), n
    print(f"dcp_reference: {path}: loaded at world 1, equal to the world-1 model", flush=True)


def dump(path):
    raw = open(os.path.join(path, ".metadata"), "rb").read()
    md = pickle.loads(raw)
    print(f"== {path}/.metadata: {len(raw)} bytes, pickle protocol {raw[1] if raw[0] == 0x80 else '?'}")
    print(f"version {md.version!r}\nstorage_meta {md.storage_meta!r}")
    print("state_dict_metadata:")
    for k, v in md.state_dict_metadata.items():
        print(f"  {k}: {v}")
    print("planner_data:")
    for k, v in md.planner_data.items():
        print(f"  {k}: {v!r}")
    print("storage_data:")
    for k, v in sorted(md.storage_data.items(), key=lambda kv: (kv[1].relative_path, kv[1].offset)):
        print(f"  {k!r}: {v!r}")
    print("== items in the .distcp files")
    for k, v in sorted(md.storage_data.items(), key=lambda kv: (kv[1].relative_path, kv[1].offset)):
        with open(os.path.join(path, v.relative_path), "rb") as f:
            f.seek(v.offset)
            blob = f.read(v.length)
        names = zipfile.ZipFile(io.BytesIO(blob)).namelist()
        obj = torch.load(io.BytesIO(blob), weights_only=False)
        # What LibTorch's torch::pickle_load (C++) makes of the same bytes
        cpp = torch._C._pickle_load_obj(blob)
        same = (torch.equal(cpp, obj) and cpp.stride() == obj.stride()) if isinstance(obj, torch.Tensor) else cpp == obj
        print(f"  {v.relative_path} [{v.offset}, +{v.length}) {k.fqn}: "
              f"{'same' if same else 'NOT the same'} through LibTorch's pickle_load; zip {names}: {obj!r}"[:400])
    print("== pickletools.dis(.metadata)")
    pickletools.dis(raw)


def main():
    if sys.argv[1:2] == ["--dump"]:
        dump(sys.argv[2])
        return
    if sys.argv[1:2] == ["--worker"]:
        kind, out = sys.argv[2], sys.argv[3]
        dist.init_process_group("gloo")
        try:
            save(kind, out)
        finally:
            dist.destroy_process_group()
        return
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    subprocess.run(run + ["--nproc-per-node", "1", __file__, "--worker", "plain", f"{out}/world1"],
                   env=env, check=True)
    subprocess.run(run + ["--nproc-per-node", "2", __file__, "--worker", "ddp", f"{out}/world2-ddp"],
                   env=env, check=True)
    fsdp2 = subprocess.run(run + ["--nproc-per-node", "2", __file__, "--worker", "fsdp2", f"{out}/world2-fsdp2"],
                           env=env)
    if fsdp2.returncode:
        print("dcp_reference: FSDP2 on the CPU with Gloo failed (above)", flush=True)
    for name in ("world2-ddp", "world2-fsdp2") if fsdp2.returncode == 0 else ("world2-ddp",):
        load_at_world1(f"{out}/{name}")


if __name__ == "__main__":
    main()
