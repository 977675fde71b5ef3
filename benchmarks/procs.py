"""Processes and ports for the benchmarks that kill workers (compare_elastic.py,
compare_fault_tolerance.py): a free port for an agent, a launcher's descendants,
and the rank a worker was started with."""
import os
import random
import socket


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
