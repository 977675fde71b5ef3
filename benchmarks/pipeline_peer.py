"""The peer of pipeline_bench.cpp: the same sleeping stages and protocol through PyTorch's
own torch.distributed.pipelining (PyTorch 2.11 from PyPI, or 2.6, Gloo), started by torchrun
(compare_pipeline.sh does it, on the venv of scripts/pypi-torch):

  "$(scripts/pypi-torch --venv-only 2.11.0)" benchmarks/pipeline_peer.py --torchrun P [flags]

--torchrun P runs torchrun's own main() (--standalone --nproc-per-node P) on this script,
without libuv, which Debian 13's PyTorch lacks (torch2_launch.py).

Flags as pipeline_bench: --schedules gpipe,1f1b,interleaved,zero-bubble --microbatches 4,8,16
--forward-ms F --input-ms I --weight-ms W --virtual V --warmup 2 --steps 5.
Schedules: gpipe -> ScheduleGPipe, 1f1b -> Schedule1F1B, interleaved -> ScheduleInterleaved1F1B
(V stages per rank, stage s on rank s % P as in cohort), zero-bubble ->
ScheduleInterleavedZeroBubble with one stage per rank (its ZB1P; PyTorch's split backward:
stage_backward_input / stage_backward_weight), zbv -> ScheduleZBVZeroBubble (two stages per
rank in a V; not in cohort, only with --schedules zbv).

Each stage's forward sleeps F ms, its input-gradient pass I ms and its weight-gradient pass W ms
(Note [Sleeping stages] in pipeline_bench.cpp). Step time: a barrier, then schedule.step() on
every rank; the median over the timed steps of the slowest rank's time. Peak live micro-batches:
counted inside the model (forwards run minus weight gradients done), per rank.
Rank 0 prints one JSON line per configuration, then a table.

PyTorch 2.6's pipelining hangs on Gloo without the upstream fix of pytorch/pytorch#132644,
which fix_batch_p2p() applies (every Work of a batched send/receive is kept and waited for).
"""
import argparse
import ctypes
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as Fn
from torch import nn
from torch2_launch import init_gloo, torchrun_without_libuv  # noqa: E402  (beside this file)
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                          ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble)

PR_SET_TIMERSLACK = 29
_libc = ctypes.CDLL(None, use_errno=True)


def sleep_ms(ms):
    # As pipeline_bench: a 1 ns timer slack (per thread) so that sleeps end on time.
    _libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if ms > 0:
        time.sleep(ms / 1000.0)


class LiveCount:
    live = 0
    peak = 0


class SleepInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, forward_ms, input_ms):
        ctx.input_ms = input_ms
        sleep_ms(forward_ms)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        sleep_ms(ctx.input_ms)
        return grad, None, None


class SleepWeight(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, weight_ms):
        ctx.weight_ms = weight_ms
        return w.clone()

    @staticmethod
    def backward(ctx, grad):
        sleep_ms(ctx.weight_ms)
        LiveCount.live -= 1
        return grad, None


class SleepStage(nn.Module):
    """y = SleepInput(x) + SleepWeight(w); stage 0 mixes w into its input path (x + 0 w), so that
    its W pass, which PyTorch runs as the whole backward (the first stage has no input pass),
    sleeps I + W like a real first stage's."""

    def __init__(self, first, forward_ms, input_ms, weight_ms):
        super().__init__()
        self.first = first
        self.costs = (forward_ms, input_ms, weight_ms)
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        f, i, w = self.costs
        h = x + self.w * 0 if self.first else x
        out = SleepInput.apply(h, f, i) + SleepWeight.apply(self.w, w)
        if torch.is_grad_enabled():
            LiveCount.live += 1
            LiveCount.peak = max(LiveCount.peak, LiveCount.live)
        return out


def formula(kind, p, m, v):
    """formula_bubble() of simulator.h: (value, is_ratio)."""
    if kind in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1), False
    if kind == "interleaved":
        return (p - 1) / (v * m), True
    if kind == "zero-bubble":
        return (p - 1) / (3 * m), True
    if kind == "zbv":  # ZB-V with equal F, I, W: no bubble in the limit; compare in ratio form
        return 0.0, True
    raise ValueError(kind)


def run_config(args, kind, m):
    rank, P = dist.get_rank(), dist.get_world_size()
    V = args.virtual if kind == "interleaved" else 2 if kind == "zbv" else 1
    n = P * V
    if kind == "zbv":
        indices = [rank, n - 1 - rank]  # the V: rank r holds stages r and 2P-1-r
    else:
        indices = [rank + c * P for c in range(V)]
    costs = (args.forward_ms / V, args.input_ms / V, args.weight_ms / V)
    stages = [PipelineStage(SleepStage(i == 0, *costs), i, n, torch.device("cpu")) for i in indices]
    loss_fn = Fn.mse_loss
    if kind == "gpipe":
        sched = ScheduleGPipe(stages[0], m, loss_fn=loss_fn)
    elif kind == "1f1b":
        sched = Schedule1F1B(stages[0], m, loss_fn=loss_fn)
    elif kind == "interleaved":
        sched = ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn)
    elif kind == "zero-bubble":
        sched = ScheduleInterleavedZeroBubble(stages, m, loss_fn=loss_fn)
    else:
        sched = ScheduleZBVZeroBubble(stages, m, loss_fn=loss_fn)
    first = 0 in indices
    last = (n - 1) in indices
    torch.manual_seed(7)
    x = torch.randn(m * args.rows, args.width)
    y = torch.zeros(m * args.rows, args.width)

    def step():
        if first and last:
            sched.step(x, target=y)
        elif first:
            sched.step(x)
        elif last:
            sched.step(target=y, losses=[])
        else:
            sched.step()

    for _ in range(args.warmup):
        dist.barrier()
        step()
    LiveCount.peak = 0
    times = []
    for _ in range(args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    mine = torch.tensor(times + [LiveCount.peak], dtype=torch.double)
    parts = [torch.empty_like(mine) for _ in range(P)]
    dist.all_gather(parts, mine)
    slowest = [max(p[i].item() for p in parts) for i in range(args.steps)]
    step_ms = statistics.median_high(slowest) * 1e3  # as pipeline_bench: xs[n/2] of the sorted
    ideal = m * (args.forward_ms + args.input_ms + args.weight_ms)
    value, is_ratio = formula(kind, P, m, V)
    fraction = 1 - ideal / step_ms
    measured = (step_ms - ideal) / ideal if is_ratio else fraction
    return {"impl": "torch", "schedule": kind, "P": P, "m": m, "V": V, "step_ms": round(step_ms, 2),
            "ideal_ms": round(ideal, 2), "convention": "ratio" if is_ratio else "fraction",
            "bubble": round(measured, 4), "bubble_fraction": round(fraction, 4), "formula": round(value, 4),
            "rel_err_formula": round((measured - value) / value, 4) if value else None,
            "model_peak_live": [int(p[-1].item()) for p in parts]}


class _Works:
    """All the works of one batch_isend_irecv, waited together."""

    def __init__(self, works):
        self.works = works

    def wait(self):
        for w in self.works:
            w.wait()


def fix_batch_p2p():
    """PyTorch 2.6's pipelining keeps only the last Work of each batch_isend_irecv
    (`dist.batch_isend_irecv(ops).pop()`). NCCL coalesces a batch into one Work; Gloo returns
    one per op, and a Gloo send whose Work is dropped is dropped with it, so Schedule1F1B
    (and the multi-stage schedules) hang at their first fused send + receive. This is
    pytorch/pytorch#132644, fixed upstream by #152938 (after 2.6) the same way: keep and
    wait for every Work. Later releases (2.11) return every Work already, and their
    schedules iterate over the list: they are left as they are."""
    import inspect

    import torch.distributed.pipelining.schedules as schedules

    if ".pop()" not in inspect.getsource(schedules._batch_p2p):
        return
    def _batch_p2p(p2p_ops, desc=None):
        if len(p2p_ops) == 0:
            return None
        return _Works(dist.batch_isend_irecv(p2p_ops))

    schedules._batch_p2p = _batch_p2p


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--torchrun":
        return torchrun_without_libuv(__file__)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", default="gpipe,1f1b,interleaved,zero-bubble")
    ap.add_argument("--microbatches", default="", help="default P, 2P, 4P")
    ap.add_argument("--forward-ms", type=float, default=20)
    ap.add_argument("--input-ms", type=float, default=20)
    ap.add_argument("--weight-ms", type=float, default=20)
    ap.add_argument("--virtual", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--width", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    fix_batch_p2p()
    init_gloo()
    P = dist.get_world_size()
    ms = [int(v) for v in args.microbatches.split(",")] if args.microbatches else [P, 2 * P, 4 * P]
    results = []
    for kind in args.schedules.split(","):
        for m in ms:
            results.append(run_config(args, kind, m))
            if dist.get_rank() == 0:
                print(json.dumps(results[-1]), flush=True)
    if dist.get_rank() == 0:
        print(f"\nPyTorch {torch.__version__} torch.distributed.pipelining, {P} ranks, F={args.forward_ms} "
              f"I={args.input_ms} W={args.weight_ms} ms, {args.steps} timed steps after {args.warmup} warm-up")
        print(f"{'schedule':<12}{'P':>3}{'m':>4}{'V':>3}{'step ms':>9}{'ideal':>9}{'conv':>6}{'measured':>9}"
              f"{'formula':>9}{'err/frm':>9}  peak live per rank (model's count)")
        for r in results:
            err = "-" if r["rel_err_formula"] is None else f"{100 * r['rel_err_formula']:.1f}%"
            print(f"{r['schedule']:<12}{r['P']:>3}{r['m']:>4}{r['V']:>3}{r['step_ms']:>9.1f}{r['ideal_ms']:>9.1f}"
                  f"{'ratio' if r['convention'] == 'ratio' else 'frac':>6}{r['bubble']:>9.4f}{r['formula']:>9.4f}"
                  f"{err:>9}  {','.join(map(str, r['model_peak_live']))}")
        print(json.dumps({"impl": "torch", "kind": "summary", "results": results}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
