"""Elastic launching, cohort run against torchrun, in one run (BENCHMARKS.md):
  1. restart: a worker of a 2-worker job is killed with SIGKILL; the time until the
     restarted job completes its first step (no checkpoint, so none is loaded), split
     into: until the new workers start, their world init, their first step;
  2. rendezvous: N agents (1..8) on this machine form one c10d rendezvous and run a
     no-op worker; launch-to-exit wall time, and for cohort the rendezvous time each
     agent reports.
Both launchers run with --monitor-interval 0.1 and Gloo on lo. Medians over REPS.
  compare_elastic.py BUILD_DIR [REPS]"""
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

from procs import Job, descendants, free_port, rank_of

build = sys.argv[1] if len(sys.argv) > 1 else "build"
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
# COHORT_BENCH_SMOKE=1 (scripts/bench-smoke): one repetition, no warm-up, 1 and 2 agents.
smoke = os.environ.get("COHORT_BENCH_SMOKE") == "1"
if smoke:
    reps = 1
here = os.path.dirname(os.path.abspath(__file__))
cli = os.path.join(build, "tools/cohort/cohort")
python = "/usr/bin/python3"
env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
           COHORT_RDZV_TOKEN="benchmark-token-" + os.urandom(8).hex())


# The line each worker of restart_worker prints at its first step.
FIRST_STEP = r'\{[^{}]*"first_step_ms"[^{}]*\}'


def restart_trial(argv):
    job = Job(argv, env, pattern=FIRST_STEP)
    try:
        job.wait_for("first step of restart 0", lambda r: r["restart"] == 0, count=2)
        time.sleep(0.5)
        victim = next(p for p in descendants(job.proc.pid) if rank_of(p) == 1)
        killed = time.time() * 1000
        os.kill(victim, signal.SIGKILL)
        after = job.wait_for("first step of restart 1", lambda r: r["restart"] == 1, count=2)
        start = min(r["start_ms"] for r in after)
        ready = max(r["ready_ms"] for r in after)
        first = max(r["first_step_ms"] for r in after)
        return {"total_s": (first - killed) / 1000, "until_start_s": (start - killed) / 1000,
                "init_s": (ready - start) / 1000, "first_step_s": (first - ready) / 1000}
    finally:
        job.stop()


def restart_benchmark():
    worker = os.path.join(build, "benchmarks/restart_worker")
    sides = {
        "cohort run": [cli, "run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                       "--monitor-interval", "0.1", worker, "400", "10"],
        "torchrun": [python, os.path.join(here, "torchrun_py311.py"), "--standalone", "--nproc_per_node", "2",
                     "--max_restarts", "1", "--monitor_interval", "0.1", os.path.join(here, "restart_peer.py"),
                     "400", "10"],
    }
    if not smoke:
        restart_trial(sides["cohort run"])  # warm-up: page cache, ccache'd binaries
        restart_trial(sides["torchrun"])
    results = {name: [] for name in sides}
    for _ in range(reps):
        for name, argv in sides.items():  # alternating, so drift hits both
            results[name].append(restart_trial(argv))
    print("\n## Restart after kill -9 of one worker (2 workers, seconds, median of %d)" % reps)
    print("| launcher | death -> first step | until new workers start | world init | first step |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print("| %s | %.2f | %.2f | %.2f | %.2f |" % (name, med["total_s"], med["until_start_s"], med["init_s"],
                                                     med["first_step_s"]))
        print(json.dumps({"benchmark": "restart", "launcher": name, "runs": runs}), file=sys.stderr)


def rendezvous_trial(side, n):
    port = free_port()
    run_id = "bench%d_%d" % (n, port)
    procs = []
    start = time.time()
    for _ in range(n):
        if side == "cohort run":
            argv = [cli, "run", "--nnodes", str(n), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", "127.0.0.1:%d" % port, "--rdzv-id", run_id, "--monitor-interval", "0.1",
                    "/bin/true"]
        else:
            argv = [python, os.path.join(here, "torchrun_py311.py"), "--nnodes", str(n), "--nproc_per_node", "1",
                    "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:%d" % port, "--rdzv_id", run_id,
                    "--monitor_interval", "0.1", "--no_python", "/bin/true"]
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True))
    errs = [p.communicate(timeout=300)[1] for p in procs]
    wall = time.time() - start
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError("%s with %d agents failed:\n%s" % (side, n, "\n".join(errs)))
    reported = [float(m) for e in errs for m in re.findall(r"rendezvous ([0-9.]+) s\)", e)]
    return wall, (max(reported) if reported else None)


def rendezvous_benchmark():
    sizes = [1, 2] if smoke else [1, 2, 3, 4, 5, 6, 7, 8]
    print("\n## Rendezvous of N agents on one machine, no-op worker (seconds, median of %d)" % reps)
    print("| agents | cohort run: launch to exit | cohort run: rendezvous (slowest agent) | torchrun: launch to exit |")
    print("|---|---|---|---|")
    rendezvous_trial("cohort run", 1)  # warm-up
    rendezvous_trial("torchrun", 1)
    for n in sizes:
        ours, theirs = [], []
        for _ in range(reps):
            ours.append(rendezvous_trial("cohort run", n))
            theirs.append(rendezvous_trial("torchrun", n)[0])
        print("| %d | %.2f | %.3f | %.2f |" % (n, statistics.median(w for w, _ in ours),
                                                statistics.median(r for _, r in ours), statistics.median(theirs)))


if __name__ == "__main__":
    restart_benchmark()
    rendezvous_benchmark()
