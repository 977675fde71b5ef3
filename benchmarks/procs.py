"""Processes and ports for the benchmarks that kill workers (compare_elastic.py,
compare_fault_tolerance.py, scale/recovery.py): a free port for an agent, a
launcher's descendants, the rank a worker was started with, and a job whose
workers' JSON lines are collected."""
import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time


def free_port():
    # Below the kernel's ephemeral range, so that no outgoing connection is handed
    # the port between this pick and the agent's bind (Note [Test ports]).
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    rng = random.SystemRandom()
    while True:
        port = rng.randrange(12000, max(low, 13000))
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
                return port
            except OSError:
                continue


def descendants(pid):
    """Every process below `pid`, found through /proc's parent links."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2:].split()[1]) == parent:
                found.append(int(entry))
                frontier.append(int(entry))
    return found


def rank_of(pid):
    """RANK from the process's environment, or None once it is gone."""
    try:
        for item in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
            if item.startswith(b"RANK="):
                return int(item[5:])
    except OSError:
        pass
    return None


# The JSON objects a worker prints: steps, summaries and events (ft_bench_worker).
WORKER_RECORDS = r'\{"(?:rank|summary|event)"[^{}]*\}'


class Job:
    """A launcher whose workers' JSON lines (the objects `pattern` finds) are
    collected by a thread."""

    def __init__(self, argv, env, pattern=WORKER_RECORDS):
        self.pattern = pattern
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, text=True)
        self.steps = []
        self.summaries = []
        self.events = []  # {"event": "arrived q5", "rank": R, "ms": T}: ft_bench_worker --log-steps
        self.lines = []
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            # Workers sharing a pipe may land on one line: take every object.
            for text in re.findall(self.pattern, line):
                record = json.loads(text)
                with self.lock:
                    if "event" in record:
                        self.events.append(record)
                    else:
                        (self.summaries if "summary" in record else self.steps).append(record)

    def wait_for(self, what, predicate, limit=120, count=1):
        """The step records `predicate` accepts, once there are `count` of them."""
        deadline = time.time() + limit
        while time.time() < deadline:
            with self.lock:
                got = [r for r in self.steps if predicate(r)]
            if len(got) >= count:
                return got
            if self.proc.poll() is not None:
                time.sleep(0.2)  # the reader's last lines
                with self.lock:
                    got = [r for r in self.steps if predicate(r)]
                if len(got) >= count:
                    return got
                break
            time.sleep(0.005)
        raise RuntimeError("no %s:\n%s" % (what, "".join(self.lines[-30:])))

    def snapshot(self):
        with self.lock:
            return list(self.steps)

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
