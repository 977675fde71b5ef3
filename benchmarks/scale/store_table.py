#!/usr/bin/env python3
"""store_table.py: scale_store.json (run_store.sh) as one Markdown table, both stores
side by side per operation and N; cohort / c10d is the ratio of ops/s (above 1:
cohort's store does more).

Usage: benchmarks/scale/store_table.py scale_store.json
"""
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
by = {(r["store"], r["clients"], r["op"]): r for r in rows}
ops = list(dict.fromkeys(r["op"] for r in rows))
ns = sorted({r["clients"] for r in rows})
backend = {r["store"]: r["backend"] for r in rows}
torch = sorted({r["torch"] for r in rows})
print(f"cohort against {backend.get('tcpstore', '?')} (LibTorch {', '.join(torch)}); ops/s over all clients, "
      "latency per op in us, server CPU us per op; medians of the repeats")
print()
print("| op | N | cohort ops/s | c10d ops/s | cohort / c10d | cohort p50 | c10d p50 | cohort p99 | c10d p99 "
      "| cohort srv us/op | c10d srv us/op |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for op in ops:
    for n in ns:
        a, b = by.get(("cohort", n, op)), by.get(("tcpstore", n, op))
        if not a or not b:
            continue
        ratio = a["ops_per_s"] / b["ops_per_s"] if b["ops_per_s"] else float("nan")
        print(f"| {op} | {n} | {a['ops_per_s']:.0f} | {b['ops_per_s']:.0f} | {ratio:.2f} | {a['p50_us']:.1f} "
              f"| {b['p50_us']:.1f} | {a['p99_us']:.1f} | {b['p99_us']:.1f} | {a['server_cpu_us_per_op']:.2f} "
              f"| {b['server_cpu_us_per_op']:.2f} |")
