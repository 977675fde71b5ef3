"""Tables of the control plane's figures against N, from the JSON lines that
scale_control_bench and recovery.py write (run_control.sh); with --plot PNG, the
plot too (needs matplotlib: Debian's python3-matplotlib). Exits 1 when a run
failed to form a round or a quorum, or a recovery check failed.
  summarise.py JSON [--plot PNG]"""
import json
import statistics
import sys

path = sys.argv[1]
plot = sys.argv[sys.argv.index("--plot") + 1] if "--plot" in sys.argv else None
lines = [json.loads(line) for line in open(path) if line.startswith("{")]
ok = True


def median(values):
    return statistics.median(values) if values else float("nan")


rdzv = {}
quorum = {}
recovery = {}
for d in lines:
    if d.get("what") == "rendezvous":
        rdzv.setdefault(d["n"], []).append(d)
        ok = ok and d["failures"] == 0
    elif d.get("what") == "quorum":
        quorum.setdefault(d["n"], []).append(d)
        ok = ok and d["failures"] == 0 and all(d[k]["sizes_ok"] for k in ("burst", "last", "death"))
    elif "recovery_s" in d:
        recovery[d["n"]] = d
        ok = ok and d["ok"]

print("### Elastic rendezvous: N agents join one round (medians; ms)")
print("| agents | last arrival -> first assigned | -> all assigned | store calls per agent | KiB per agent | record KiB |")
print("|---|---|---|---|---|---|")
for n, ds in sorted(rdzv.items()):
    print("| %d | %.1f | %.1f | %.1f | %.1f | %.1f |" % (
        n, median([d["ms_last_arrival_to_first_assigned"] for d in ds]),
        median([d["ms_last_arrival_to_all_assigned"] for d in ds]),
        median([d["store_calls"] / n for d in ds]), median([d["store_bytes"] / n / 1024 for d in ds]),
        ds[0]["record_bytes"] / 1024))
print()
print("### Fault-tolerance quorums of N replicas (medians; ms to the first / the last replica's decision)")
print("| replicas | burst: all arrive at once | last arrival | death published | calls per replica per quorum | "
      "KiB per replica per quorum | store keys per quorum |")
print("|---|---|---|---|---|---|---|")
for n, ds in sorted(quorum.items()):
    def both(k):
        return "%.1f / %.1f" % (median([d[k]["ms_to_first_decided"] for d in ds]),
                                median([d[k]["ms_to_all_decided"] for d in ds]))
    calls = median([d["last"]["store_calls"] / n for d in ds])
    kib = median([d["last"]["store_bytes"] / n / 1024 for d in ds])
    print("| %d | %s | %s | %s | %.1f | %.1f | %.0f |" % (n, both("burst"), both("last"), both("death"), calls, kib,
                                                         ds[0]["store_keys"] / 3))
if recovery:
    print()
    print("### Recovery in real processes: kill -9 -> the survivors' next committed step (s)")
    print("| replicas | kills | median | max | to the next quorum's first arrival, its decision, its group formed "
          "(medians) | a step when none fails | steps | lost, repeated or dropped |")
    print("|---|---|---|---|---|---|---|---|")
    for n, d in sorted(recovery.items()):
        print("| %d | %d | %s | %s | %s, %s, %s | %s | %d | %s |" % (
            n, d["kills"], d["median_s"], d["max_s"], d.get("to_arrived_s"), d.get("to_decided_s"),
            d.get("to_formed_s"), d.get("step_s"), d["steps"],
                                                "none" if d["ok"] else "; ".join(d["problems"])))

if plot:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    def series(table, f, label, style):
        ns = sorted(table)
        ax.plot(ns, [f(table[n]) for n in ns], style, label=label)
    series(rdzv, lambda ds: median([d["ms_last_arrival_to_all_assigned"] for d in ds]),
           "rendezvous: last arrival -> all assigned", "o-")
    series(quorum, lambda ds: median([d["last"]["ms_to_first_decided"] for d in ds]),
           "quorum: last arrival -> decided", "s-")
    series(quorum, lambda ds: median([d["last"]["ms_to_all_decided"] for d in ds]),
           "quorum: last arrival -> every replica has it", "s--")
    series(quorum, lambda ds: median([d["death"]["ms_to_first_decided"] for d in ds]),
           "quorum: death -> decided", "^-")
    if recovery:
        series(recovery, lambda d: d["median_s"] * 1000, "recovery, real processes: kill -9 -> next step", "D-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("agents or replicas (N)")
    ax.set_ylabel("milliseconds")
    ax.set_title("cohort's control plane against N (2-core machine, one store)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(plot, dpi=110)
    print("\nplot: %s" % plot)
sys.exit(0 if ok else 1)
