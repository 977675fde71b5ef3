"""The peer of examples/gpt: the same decoder-only transformer, initial weights, batches,
optimizer and schedule, trained with PyTorch's own tensor parallelism
(torch.distributed.tensor.parallel) or DistributedDataParallel, started by `cohort run`
as torchrun would start it (it reads RANK, WORLD_SIZE, MASTER_ADDR/PORT).

  cohort run --nproc-per-node 2 python3 gpt_peer.py --data DIR --initial INIT.pt --tp 2 ...

DIR is what `gpt --dump-data DIR` writes (train.bin, val.bin: int32 token ids, and
meta.json), INIT.pt what `gpt --save-initial INIT.pt` writes: the whole model's
weights by name, before the first step. The batch rule is examples/gpt's
(Note [The batch rule] there, docs/gpt.md): step s, global sample j starts at
((s * B + j) * 1000003) mod (N - context - 1), and data-parallel replica d takes
samples [d B / D, (d + 1) B / D).

The vocabulary-parallel embedding and the tied output layer are PyTorch's usual
pieces: RowwiseParallel shards the embedding's rows, the output multiplies by the
same sharded table as a DTensor, and the loss runs under loss_parallel(), so the
whole logits are never gathered, as in cohort.

Rank 0 prints "step N loss X" per step with --log-losses, and one JSON line at the
end: tokens per second as examples/gpt reports it (all steps' tokens over all
steps' time), the median step time after --timing-warmup steps, and the timed
tokens/s and MFU (below).

On a GPU (scripts/gpu-check) it is "PyTorch eager" beside `gpt --preset gpt2-small
--device cuda --amp bf16`: --device cuda, --amp bf16 (torch.autocast), --attention
sdpa (F.scaled_dot_product_attention, is_causal=True: flash attention, as cohort's
fused path) and PyTorch's default AdamW (its foreach step on CUDA). As the trainer
(Note [Timing after a warm-up] in examples/gpt/trainer.cpp), it then reads the loss
only at the end, synchronises the device after --timing-warmup steps and after the
last, and gives timed_tokens_per_second over the steps between. MFU is GptImpl::
training_flops (examples/gpt/model.cpp) at that rate over --peak-tflops per process,
which gpu-check takes from the trainer's JSON line so both sides divide by the same
peak; without it, mfu is null.

With --checkpoint-mode sync|async (issue 49's benchmark against PyTorch's distributed
checkpoints), every --checkpoint-every N optimizer steps the model and the optimizer
are saved with torch.distributed.checkpoint to DIR/step-S (class Checkpointer, as in
trainer_peer.py), inside the timed step; the JSON line gains checkpoints,
checkpoint_blocked_ms_median/_max, checkpoint_final_wait_ms, rss_mb_start/_end and
checkpoint_mode (trainer_peer.py's docstring). With none (the default) nothing changes.
"""
import argparse
import json
import math
import os
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dcp_checkpointer import Checkpointer  # noqa: E402  (beside this script)


class Attention(nn.Module):
    def __init__(self, h, heads, sdpa):
        super().__init__()
        self.heads, self.head_dim, self.sdpa = heads, h // heads, sdpa
        self.query, self.key, self.value, self.proj = (nn.Linear(h, h) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape

        def split(t):  # local heads under TP: the column layers' output is this rank's heads
            return t.view(b, s, -1, self.head_dim).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        if self.sdpa:
            return self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        future = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), -1)
        return self.proj((probs @ v).transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, h, heads, sdpa):
        super().__init__()
        self.ln1, self.attention, self.ln2 = nn.LayerNorm(h), Attention(h, heads, sdpa), nn.LayerNorm(h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Gpt(nn.Module):
    """examples/gpt/model.h's model, parameter for parameter (dropout 0)."""

    def __init__(self, vocab, context, h, heads, layers, sdpa=False):
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, h), nn.Embedding(context, h)
        self.blocks = nn.ModuleList(Block(h, heads, sdpa) for _ in range(layers))
        self.norm = nn.LayerNorm(h)
        self.tp_mesh = None

    def forward(self, ids):
        x = self.embed(ids) + self.position.weight[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        table = self.embed.weight
        if self.tp_mesh is not None:
            from torch.distributed.tensor import DTensor, Replicate

            # A replicated hidden state times the row-sharded table gives logits sharded
            # over the vocabulary; backward all-reduces the hidden state's gradient.
            x = DTensor.from_local(x, self.tp_mesh, [Replicate()])
        return F.linear(x, table)


def parallelize(model, tp_mesh):
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {"embed": RowwiseParallel(input_layouts=Replicate())}
    for i in range(len(model.blocks)):
        for name in ("attention.query", "attention.key", "attention.value", "fc1"):
            plan[f"blocks.{i}.{name}"] = ColwiseParallel()
        for name in ("attention.proj", "fc2"):
            plan[f"blocks.{i}.{name}"] = RowwiseParallel()
    parallelize_module(model, tp_mesh, plan)
    model.tp_mesh = tp_mesh
    return model


def learning_rate(step, args):
    """examples/gpt's schedule (optimizer.cpp): linear warm-up, then cosine down to a
    tenth of the peak at the last step."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    decay = max(1, args.steps - 1 - args.warmup_steps)
    done = min(1.0, max(0.0, (step - args.warmup_steps) / decay))
    floor = args.lr / 10
    return floor + (args.lr - floor) * 0.5 * (1 + math.cos(math.pi * done))


def training_flops(tokens, args, vocab):
    """GptImpl::training_flops (examples/gpt/model.cpp): forward's matmuls, 2 x (12 h^2
    per layer + v h for the logits) per token, plus attention's 2 x 2 x s x h per
    layer; backward twice forward."""
    h, layers, s = args.embed_dim, args.layers, args.context
    per_token = 2.0 * (12.0 * h * h * layers + vocab * h) + 4.0 * s * h * layers
    return 3.0 * per_token * tokens


def batch(tokens, step, args, dp_rank, dp_size):
    """Note [The batch rule] of examples/gpt."""
    n, s, b = len(tokens), args.context, args.batch_size
    per = b // dp_size
    rows = [((step * b + j) * 1000003) % (n - s - 1) for j in range(dp_rank * per, (dp_rank + 1) * per)]
    window = np.stack([tokens[o : o + s + 1] for o in rows]).astype(np.int64)
    w = torch.from_numpy(window)
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--initial", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--timing-warmup", type=int, default=5, help="first steps left out of the timing")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--embed-dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup-steps", type=int, default=-1, help="learning-rate warm-up (-1: a tenth of --steps)")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--log-losses", action="store_true")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--amp", choices=("none", "bf16"), default="none", help="torch.autocast's dtype")
    p.add_argument("--attention", choices=("explicit", "sdpa"), default="explicit",
                   help="softmax(q k^T) v with a mask, or F.scaled_dot_product_attention")
    p.add_argument("--peak-tflops", type=float, default=0, help="the peak per process for mfu (0: no mfu)")
    p.add_argument("--checkpoint-dir", default="")
    p.add_argument("--checkpoint-every", type=int, default=0, help="optimizer steps between checkpoints")
    p.add_argument("--checkpoint-mode", default="none", choices=["none", "sync", "async"])
    args = p.parse_args()
    if args.warmup_steps < 0:
        args.warmup_steps = args.steps // 10

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", "0")) if args.device == "cuda" else None)
    if device.type == "cuda":
        if args.tp > 1:
            raise SystemExit("gpt_peer: --tp > 1 runs on the CPU only (its mesh is Gloo's); use --device cpu")
        torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.tp:
        raise SystemExit(f"gpt_peer: --tp {args.tp} does not divide the world size {world}")
    dp_size = world // args.tp

    meta = json.load(open(os.path.join(args.data, "meta.json")))
    tokens = np.fromfile(os.path.join(args.data, "train.bin"), dtype=np.int32)
    vocab = meta.get("padded_vocab_size", meta["vocab_size"])  # the tied table's rows, padding included
    model = Gpt(vocab, args.context, args.embed_dim, args.heads, args.layers, sdpa=args.attention == "sdpa")
    state = torch.load(args.initial)
    model.load_state_dict({k: v for k, v in state.items()}, strict=True)
    model.to(device)

    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dp_size, args.tp), mesh_dim_names=("dp", "tp"))
    if args.tp > 1:
        if dp_size > 1:
            raise SystemExit("gpt_peer: DP x TP is not wired in the peer; use --tp 1 (DDP) or --tp = world size")
        model = parallelize(model, mesh["tp"])
        net = model
    elif dp_size > 1:
        net = nn.parallel.DistributedDataParallel(model, process_group=mesh["dp"].get_group())
    else:
        net = model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    dp_rank = mesh["dp"].get_local_rank()
    checkpointer = Checkpointer(args.checkpoint_dir, args.checkpoint_every, args.checkpoint_mode, rank)

    from torch.distributed.tensor.parallel import loss_parallel

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    # On a GPU the loss is read every step only with --log-losses (or DP's average),
    # so the host does not wait for the device (examples/gpt's Note [No host read per step]).
    read_each_step = device.type == "cpu" or args.log_losses or dp_size > 1
    times, all_times, loss = [], [], None
    timed_begin = synchronize() if args.timing_warmup == 0 else None
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, args)
        start = time.perf_counter()  # as examples/gpt times a step: batch, step, loss value
        x, y = batch(tokens, step, args, dp_rank, dp_size)
        if device.type == "cuda":
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp == "bf16"):
            logits = net(x)
        if args.amp != "none":
            logits = logits.float()  # the loss in float32, as the trainer's
        if args.tp > 1:
            with loss_parallel():
                loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
                loss.backward()
            loss = loss.full_tensor()
        else:
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            loss.backward()
        opt.step()
        checkpointer.step(step + 1, model, opt)
        if not read_each_step:
            elapsed = time.perf_counter() - start
            all_times.append(elapsed)
            if step + 1 == args.timing_warmup:
                timed_begin = synchronize()
            continue
        value = float(loss.detach())
        if dp_size > 1:
            t = torch.tensor([value], dtype=torch.float64)
            dist.all_reduce(t, group=mesh["dp"].get_group())
            value = float(t) / dp_size
        elapsed = time.perf_counter() - start
        all_times.append(elapsed)
        if step >= args.timing_warmup:
            times.append(elapsed)
        if step + 1 == args.timing_warmup:
            timed_begin = synchronize()
        if rank == 0 and args.log_losses:
            print(f"step {step + 1} loss {value:.6f}", flush=True)
    timed_end = synchronize()
    timed_steps = max(0, args.steps - args.timing_warmup)
    timed_s = timed_end - timed_begin if timed_steps else None
    timed_rate = timed_steps * args.batch_size * args.context / timed_s if timed_steps else None
    gflops = None
    if timed_steps:
        gflops = training_flops(timed_steps * args.batch_size * args.context, args, vocab) / timed_s / 1e9
    peak_tflops = args.peak_tflops * world
    median = statistics.median(times) if times else None
    checkpoint_keys = checkpointer.finish()
    if rank == 0:
        print(json.dumps({"peer": "pytorch", "torch": torch.__version__, "tp": args.tp, "dp": dp_size,
                          "device": str(device), "amp": args.amp, "attention": args.attention,
                          "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "",
                          "train_loss": float(loss.detach()),
                          "steps_timed": len(times), "median_step_s": median,
                          "median_tokens_per_second": args.batch_size * args.context / median if median else None,
                          "timing_warmup": args.timing_warmup, "timed_steps": timed_steps, "timed_seconds": timed_s,
                          "timed_tokens_per_second": timed_rate, "gflops": gflops,
                          "peak_tflops": peak_tflops or None,
                          "mfu": gflops / (peak_tflops * 1e3) if peak_tflops and gflops else None,
                          # examples/gpt's definition: every step's tokens over every step's time
                          "tokens_per_second": args.steps * args.batch_size * args.context / sum(all_times),
                          **checkpoint_keys}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
