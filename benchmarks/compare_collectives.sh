#!/usr/bin/env bash
# All-reduce latency, cohort against PyTorch's torch.distributed, in one run: both
# started by `cohort run` with the same world size, Gloo over loopback, one thread
# per rank. Prints each side's JSON lines, then a table of medians.
#   benchmarks/compare_collectives.sh [BUILD_DIR] [NPROC]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/bench_env.sh"
build=${1:-build}
nproc=${2:-2}
python=/usr/bin/python3   # Debian's python3-torch
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$build/tools/cohort/cohort" run --nproc-per-node "$nproc" --local-ranks-filter 0 \
  "$build/benchmarks/collectives_compare" | sed 's/^\[rank0\]: //' | tee -a "$out"
"$build/tools/cohort/cohort" run --nproc-per-node "$nproc" --local-ranks-filter 0 \
  "${peer_conf[@]}" "$python" "$here/collectives_peer.py" | sed 's/^\[rank0\]: //' | tee -a "$out"
"$python" - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {(r["impl"], r["numel"]): r for r in rows}
print(f"\n{'floats':>9} {'cohort us':>10} {'torch us':>10} {'torch/cohort':>13}")
for numel in sorted({r["numel"] for r in rows}):
    c, t = by[("cohort", numel)], by[("torch.distributed", numel)]
    print(f"{numel:>9} {c['median_us']:>10.1f} {t['median_us']:>10.1f} {t['median_us'] / c['median_us']:>13.2f}")
PY
