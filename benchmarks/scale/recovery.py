"""Recovery in real processes at N replicas (issue 47, docs/scale.md): one job of N
workers under `cohort run --fault-tolerance in-process` (benchmarks/ft_bench_worker,
an MLP under DDP over Gloo, a global batch per step, --log-steps), and KILLS kill -9s
in a row, each once the previous victim's replacement has committed 5 steps. The
victims cycle over the ranks (rank 0 included). For each kill: the seconds from the
kill to the first step committed by a survivor in a newer quorum (the workers stamp
their steps with wall-clock milliseconds). Then, over the whole job, what must hold:
  - it exits 0, and every kill was made;
  - no step lost or repeated: each incarnation of each rank commits consecutive
    steps, no rank commits a step twice, and every step up to the last is committed
    by some replica;
  - no survivor dropped: a rank's incarnation rises only when it is killed (a
    survivor that was dropped and re-admitted would come back as a new process).
Prints one JSON line per N ({"n":..,"recovery_s":[..],"median_s":..,"ok":..}) and a
table; exits 1 when a check fails.
  recovery.py BUILD_DIR [N ...] (default 4 8 16); KILLS (default 10) in the
  environment; COHORT_BENCH_SMOKE=1: N = 4 and 3 kills."""
import json
import os
import signal
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from procs import Job, descendants, free_port, rank_of  # noqa: E402

build = sys.argv[1] if len(sys.argv) > 1 else "build"
smoke = os.environ.get("COHORT_BENCH_SMOKE") == "1"
sizes = [int(n) for n in sys.argv[2:]] or ([4] if smoke else [4, 8, 16])
kills = int(os.environ.get("KILLS", "3" if smoke else "10"))
cli = os.path.join(build, "tools/cohort/cohort")
worker = os.path.join(build, "benchmarks/ft_bench_worker")
# A small model: the control plane is what is measured, not the step.
model = ["--features", "64", "--hidden", "64", "--global-batch", "64"]
env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
           COHORT_RDZV_TOKEN="benchmark-token-" + os.urandom(8).hex(),
           MALLOC_MMAP_THRESHOLD_="1000000000", MALLOC_TRIM_THRESHOLD_="1000000000")


def committed(job):
    return [r for r in job.snapshot() if r["committed"]]


def run(n):
    steps = 100000  # ended by the launcher's stop below, once the kills are done
    argv = [cli, "run", "--nproc-per-node", str(n), "--master-port", str(free_port()), "--max-restarts",
            str(kills + 2), "--monitor-interval", os.environ.get("MONITOR_INTERVAL", "0.1"), "--fault-tolerance", "in-process",
            worker, "--mode", "ft", "--log-steps", "--steps", str(steps)] + model
    job = Job(argv, env)
    recovery, victims, problems, phases = [], [], [], {}
    try:
        job.wait_for("20 committed steps", lambda r: r["committed"] and r["step"] >= 20, limit=300)
        for k in range(kills):
            victim = (1 + 5 * k) % n
            pids = [p for p in descendants(job.proc.pid) if rank_of(p) == victim]
            if len(pids) != 1:
                raise RuntimeError("%d processes of rank %d" % (len(pids), victim))
            before = job.snapshot()
            old_quorum = max(r["quorum"] for r in before)
            incarnation = max(r["inc"] for r in before if r["rank"] == victim)
            killed = time.time() * 1000
            os.kill(pids[0], signal.SIGKILL)
            first = job.wait_for("a survivor's step in a newer quorum", lambda r: r["committed"] and
                                 r["rank"] != victim and r["quorum"] > old_quorum and r["ms"] >= killed, limit=300)
            recovery.append((min(r["ms"] for r in first) - killed) / 1000)
            # The phases: a survivor at the next quorum (its collective failed), the
            # quorum decided and its group formed.
            with job.lock:
                events = [e for e in job.events if e["ms"] >= killed and e["rank"] != victim]
            for name, key in (("arrived", "arrived"), ("decided", "decided"), ("formed", "formed")):
                times = [e["ms"] for e in events if e["event"].startswith(key + " q") and
                         int(e["event"].split("q")[1]) > old_quorum]
                if times:
                    phases.setdefault(name, []).append((min(times) - killed) / 1000)
            victims.append(victim)
            back = job.wait_for("the replacement's step", lambda r: r["committed"] and r["rank"] == victim and
                                r["inc"] > incarnation, limit=300)
            job.wait_for("5 steps of the replacement", lambda r: r["committed"] and r["rank"] == victim and
                         r["inc"] > incarnation and r["step"] >= back[0]["step"] + 5, limit=300)
    finally:
        steps_seen = committed(job)
        job.stop()
    by_rank = {}
    for r in steps_seen:
        by_rank.setdefault((r["rank"], r["inc"]), []).append(r["step"])
    seen = {}
    for (rank, inc), got in sorted(by_rank.items()):
        if any(b != a + 1 for a, b in zip(got, got[1:])):
            problems.append("rank %d incarnation %d skipped or repeated a step: %s" % (rank, inc, got[:50]))
        for step in got:
            seen.setdefault(step, []).append(rank)
    for step, ranks in seen.items():
        if len(ranks) != len(set(ranks)):
            problems.append("step %d committed twice by one rank: %s" % (step, ranks))
    if seen and sorted(seen) != list(range(min(seen), max(seen) + 1)):
        problems.append("some step in %d..%d was committed by nobody" % (min(seen), max(seen)))
    for rank in range(n):
        incs = {inc for (r, inc) in by_rank if r == rank}
        if max(incs, default=0) != victims.count(rank):
            problems.append("rank %d reached incarnation %d after %d kills: a survivor was dropped" %
                            (rank, max(incs, default=0), victims.count(rank)))
    if len(recovery) != kills:
        problems.append("%d of %d kills made" % (len(recovery), kills))
    # The step time when nothing fails: a recovery includes the redone step, and
    # at 16 processes on 2 cores a step is most of it.
    gaps = []
    for (rank, inc), got in by_rank.items():
        ms = sorted(r["ms"] for r in steps_seen if r["rank"] == rank and r["inc"] == inc)
        gaps += [b - a for a, b in zip(ms, ms[1:])]
    step_s = statistics.median(gaps) / 1000 if gaps else None
    return {"n": n, "kills": len(recovery),
            "to_arrived_s": round(statistics.median(phases["arrived"]), 3) if phases.get("arrived") else None,
            "to_decided_s": round(statistics.median(phases["decided"]), 3) if phases.get("decided") else None,
            "to_formed_s": round(statistics.median(phases["formed"]), 3) if phases.get("formed") else None,
            "step_s": round(step_s, 3) if step_s else None, "recovery_s": [round(x, 3) for x in recovery],
            "median_s": round(statistics.median(recovery), 3) if recovery else None,
            "max_s": round(max(recovery), 3) if recovery else None,
            "steps": max(seen) if seen else 0, "ok": not problems, "problems": problems}


def main():
    failed = False
    rows = []
    for n in sizes:
        result = run(n)
        print(json.dumps(result), flush=True)
        rows.append(result)
        failed = failed or not result["ok"]
    print("| replicas | kills | recovery median (s) | max (s) | of which: to the next quorum's first arrival, "
          "decided, its group formed | a step when none fails (s) | steps | lost, repeated or dropped |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %d | %d | %s | %s | %s, %s, %s | %s | %d | %s |" % (
            r["n"], r["kills"], r["median_s"], r["max_s"], r["to_arrived_s"], r["to_decided_s"], r["to_formed_s"],
            r["step_s"],
            r["steps"],
                                               "none" if r["ok"] else "; ".join(r["problems"])))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
