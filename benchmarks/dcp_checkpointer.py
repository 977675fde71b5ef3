"""The PyTorch peers' checkpoints for issue 49's benchmark (benchmarks/trainer_peer.py,
benchmarks/gpt_peer.py, benchmarks/compare_checkpoints.sh): PyTorch's distributed
checkpoints, saved the way torchtitan saves them, with the time each save holds the
training loop. Imports torch.distributed.checkpoint only when a mode other than none
is asked for, so that the peers still run on torch 1.13 without checkpoints."""
import os
import statistics
import time

import torch
import torch.distributed as dist


class Checkpointer:
    """--checkpoint-mode sync|async: every --checkpoint-every optimizer steps, the model's
    and the optimizer's state (torch.distributed.checkpoint.state_dict.get_state_dict, as
    torchtitan takes it) saved with torch.distributed.checkpoint to DIR/step-S: dcp.save,
    or dcp.async_save with at most one save in flight (the previous one's result() is
    awaited before the next starts, as torchtitan does; the last one at finish()). The
    async saves' collectives run on a Gloo group of their own, so that they never
    interleave with the training's on the default group. Rank 0 times how long each
    save blocks the training loop (the wait for the previous save included). With
    --checkpoint-mode none (the default) nothing is imported or done, so the peer still
    runs on torch 1.13."""

    def __init__(self, directory, every, mode, rank):
        self.enabled = mode != "none"
        if self.enabled and (not directory or every <= 0):
            raise SystemExit("--checkpoint-mode sync|async needs --checkpoint-dir and --checkpoint-every N > 0")
        self.directory, self.every, self.mode, self.rank = directory, every, mode, rank
        self.future, self.blocked_ms, self.rss_mb_start, self.rss_mb_end = None, [], None, None
        if self.enabled:
            try:
                import torch.distributed.checkpoint as dcp
                from torch.distributed.checkpoint.state_dict import get_state_dict
            except ImportError as e:
                raise SystemExit(f"--checkpoint-mode {mode} needs torch.distributed.checkpoint.state_dict "
                                 f"(PyTorch 2.2 or later), not in torch {torch.__version__}: {e}")
            self.dcp, self.get_state_dict = dcp, get_state_dict
        self.group = dist.new_group(backend="gloo") if mode == "async" else None

    @staticmethod
    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def _wait(self):
        if self.future is not None:
            # torch >= 2.9 may answer an AsyncSaveResponse (a stager that returns a future)
            getattr(self.future, "upload_completion", self.future).result()
            self.future = None

    def step(self, step, model, optimizer):
        """After optimizer step number `step` (1-based): save when it is due."""
        if not self.enabled or step % self.every:
            return
        if self.rss_mb_start is None:
            self.rss_mb_start = self.rss_mb()
        begin = time.perf_counter()
        self._wait()
        model_state, optimizer_state = self.get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optimizer_state}
        checkpoint_id = os.path.join(self.directory, f"step-{step}")
        if self.mode == "sync":
            self.dcp.save(state, checkpoint_id=checkpoint_id)
        else:
            self.future = self.dcp.async_save(state, checkpoint_id=checkpoint_id, process_group=self.group)
        self.blocked_ms.append((time.perf_counter() - begin) * 1e3)

    def finish(self):
        """Waits for the last async save; the JSON line's checkpoint keys (none without checkpoints)."""
        if not self.enabled:
            return {}
        begin = time.perf_counter()
        self._wait()
        final_wait_ms = (time.perf_counter() - begin) * 1e3
        self.rss_mb_end = self.rss_mb()
        blocked = self.blocked_ms
        return {"checkpoint_mode": self.mode, "checkpoints": len(blocked),
                "checkpoint_blocked_ms_median": statistics.median(blocked) if blocked else None,
                "checkpoint_blocked_ms_max": max(blocked) if blocked else None,
                "checkpoint_final_wait_ms": final_wait_ms,
                "rss_mb_start": self.rss_mb_start, "rss_mb_end": self.rss_mb_end}
