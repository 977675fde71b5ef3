#!/usr/bin/env bash
# DDP at world 2: two builds of cohort (e.g. an old commit and today's) beside
# PyTorch's DDP, interleaved rep by rep so that a drifting machine affects all
# three alike (issue 33, BENCHMARKS.md). Each build runs under its own launcher,
# since the store's protocol may differ between commits.
#   benchmarks/compare_ddp_builds.sh OLD_BUILD NEW_BUILD [REPS]
# Prints one line per run, then the medians of throughput (steps/s) per allocator
# setting (Note [Equal allocator settings] in bench_env.sh) and of the deep
# model's overlap at batch 16 and 64. COHORT_BENCH_SMOKE=1: one rep, few steps.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/bench_env.sh"
old=${1:?old build dir}
new=${2:?new build dir}
reps=${3:-3}
extra=() overlap=()
if [[ $bench_smoke == 1 ]]; then reps=1 extra=(--steps 2 --reps 1 --warmup 1) overlap=(--steps 2 --warmup 1); fi
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# side SETTING NAME ARGS...: one run at world 2, rank 0's JSON tagged with side and setting.
side() {
  local setting=$1 name=$2
  shift 2
  local launch prog=()
  case $name in
    old) launch=$old/tools/cohort/cohort prog=("$old/benchmarks/ddp_bench") ;;
    new) launch=$new/tools/cohort/cohort prog=("$new/benchmarks/ddp_bench") ;;
    torch) launch=$new/tools/cohort/cohort prog=("${peer_conf[@]}" /usr/bin/python3 "$here/ddp_peer.py") ;;
  esac
  # shellcheck disable=SC2046
  (export $(malloc_env "$setting")
   "$launch" run --nproc-per-node 2 --local-ranks-filter 0 "${prog[@]}" "$@") |
    sed -n 's/^\[rank0\]: {/{/p' | sed "s/^{/{\"side\":\"$name\",\"malloc\":\"$setting\",/" | tee -a "$out"
}

for ((i = 1; i <= reps; i++)); do
  for setting in "${malloc_settings[@]}"; do
    for name in old new torch; do side "$setting" "$name" throughput --mode ddp "${extra[@]}"; done
  done
  for batch in 16 64; do
    for name in old new; do side equal "$name" overlap --model deep --batch "$batch" "${overlap[@]}"; done
  done
done

/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
tp = collections.defaultdict(list)
ov = collections.defaultdict(list)
for r in rows:
    if "steps_per_s" in r:
        tp[(r["malloc"], r["model"], r["side"])].append(r["steps_per_s"])
    elif r.get("kind") == "overlap-summary":
        ov[(r["batch"], r["side"])].append(r)
med = lambda xs: statistics.median(xs) if xs else float("nan")
for setting in sorted({k[0] for k in tp}):
    print(f"\n### Throughput at world 2, steps/s (median of {len(next(iter(tp.values())))} runs; allocator: {setting})")
    print(f"{'model':6} {'old':>8} {'new':>8} {'torch':>8} {'new/old':>8} {'new/torch':>9}")
    for model in ("mlp", "cnn", "deep"):
        o, n, t = (med(tp[(setting, model, s)]) for s in ("old", "new", "torch"))
        print(f"{model:6} {o:8.1f} {n:8.1f} {t:8.1f} {n / o:8.2f} {n / t:9.2f}")
print("\n### Overlap of the deep model at world 2 (median over runs; allocator: equal)")
print(f"{'batch':>5} {'side':5} {'backward ms':>12} {'wait after ms':>14} {'hidden':>7}")
for (batch, side), rs in sorted(ov.items()):
    print(f"{batch:5} {side:5} {med([r['backward_ms'] for r in rs]):12.2f} "
          f"{med([r['wait_after_backward_ms'] for r in rs]):14.2f} {med([r['hidden_fraction'] for r in rs]):7.3f}")
PY
