#!/usr/bin/env bash
# Operators dispatched per training step (issue 48), cohort against PyTorch on the same
# models (the Fashion-MNIST trainer's network and bench_models.h's three) with Adam:
# op_count (cohort::optim::Adam's automatic kernel, then torch::optim::Adam) beside
# op_count_peer.py (torch.optim.Adam with PyTorch's defaults), without DDP at world 1
# and under each side's DDP over Gloo at world 2. Both sides are started by
# `cohort run`; Note [What counts as an operator] in op_count.cpp says what counts.
#   benchmarks/compare_op_count.sh [BUILD_DIR]
# Prints every JSON line, then the tables; exits 1 when cohort, with its automatic
# kernel, dispatches more operators per step than PyTorch on any row: the goal that
# CI keeps (scripts/bench-smoke runs it on the 1.13 and the PyPI 2.11 trees).
# The peer runs on the python of BUILD_DIR's COHORT_PYTHON (Debian's python3 for a
# 1.13 tree, scripts/pypi-torch's venv for a PyPI tree), or on COHORT_PEER_PYTHON;
# its torch must be the version the build links. COHORT_BENCH_SMOKE=1 counts 2 steps.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/bench_env.sh"
build=${1:-build}
bench=$build/benchmarks/op_count
[[ -x $bench ]] || { echo "compare_op_count: no $bench (COHORT_BUILD_BENCHMARKS=ON, target op_count)" >&2; exit 2; }
python=${COHORT_PEER_PYTHON:-$(sed -n 's/^COHORT_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt")}
python=${python:-/usr/bin/python3}
peer=$here/op_count_peer.py
counted=(--steps 10 --warmup 3)
if [[ $bench_smoke == 1 ]]; then counted=(--steps 2 --warmup 2); fi
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# run WORLD PROGRAM ARGS...: rank 0's JSON lines, echoed and kept (a Python peer is a
# stock c10d worker: Note [Stock workers under cohort run] in bench_env.sh).
run() {
  local world=$1
  shift
  local conf=()
  [[ $1 == "$python" ]] && conf=("${peer_conf[@]}")
  "$build/tools/cohort/cohort" run --nproc-per-node "$world" --local-ranks-filter 0 "${conf[@]}" "$@" |
    sed 's/^\[rank0\]: //' | grep '^{' | tee -a "$out"
}

for mode in local ddp; do
  world=$([[ $mode == local ]] && echo 1 || echo 2)
  run "$world" "$bench" --mode "$mode" --optimizer cohort "${counted[@]}"
  run "$world" "$bench" --mode "$mode" --optimizer torch "${counted[@]}"
  run "$world" "$python" "$peer" --mode "$mode" "${counted[@]}"
done

"$python" - "$out" <<'PY'
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1])]
versions = {r["impl"]: ".".join(r["torch"].split(".")[:2]) for r in rows}
if len(set(versions.values())) != 1:
    sys.exit(f"compare_op_count: the peer's torch is not the build's LibTorch: {versions} "
             "(COHORT_PEER_PYTHON picks the peer's python)")
key = lambda r: (r["model"], r["mode"], r["world"])
auto = {key(r): r for r in rows if r["impl"] == "cohort" and r["optimizer"] == "cohort::optim::Adam"}
plain = {key(r): r for r in rows if r["impl"] == "cohort" and r["optimizer"] == "torch::optim::Adam"}
torch = {key(r): r for r in rows if r["impl"] == "pytorch"}

def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)

def ratio(a, b):
    return a / b if a is not None and b else None

print(f"\nOperators per training step, LibTorch {next(iter(versions.values()))} (Adam; cohort's kernel: "
      f"{next(iter(auto.values()))['kernel']}); ratios below 1: cohort dispatches fewer")
print(f"{'model':<8}{'mode':>6}{'world':>6}{'cohort':>9}{'torch::optim':>13}{'pytorch':>9}"
      f"{'cohort/pytorch':>15}{'torch::optim/pytorch':>21}")
worse = []
for k, t in torch.items():
    c, p = auto.get(k, {}).get("ops_per_step"), plain.get(k, {}).get("ops_per_step")
    print(f"{k[0]:<8}{k[1]:>6}{k[2]:>6}{fmt(c):>9}{fmt(p):>13}{fmt(t['ops_per_step']):>9}"
          f"{fmt(ratio(c, t['ops_per_step']), '.2f'):>15}{fmt(ratio(p, t['ops_per_step']), '.2f'):>21}")
    if c is None or c > t["ops_per_step"]:
        worse.append(k)

print("\nBy phase, operators per step, cohort (automatic kernel) / pytorch; top level: those no other "
      "counted operator encloses")
print(f"{'model':<8}{'mode':>6}{'zero_grad':>12}{'forward':>14}{'backward':>14}{'step':>14}{'top level':>14}")
for k, t in torch.items():
    c = auto.get(k, {})
    cells = [f"{fmt(c.get(p), '.0f')} / {fmt(t[p], '.0f')}"
             for p in ("zero_grad", "forward", "backward", "step", "top_level_per_step")]
    print(f"{k[0]:<8}{k[1]:>6}" + "".join(f"{cell:>{w}}" for cell, w in zip(cells, (12, 14, 14, 14, 14))))

if worse:
    sys.exit(f"\ncompare_op_count: cohort dispatches more operators per step than PyTorch on {worse}")
print(f"\ncohort <= pytorch on all {len(torch)} rows")
PY
