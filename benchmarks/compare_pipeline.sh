#!/usr/bin/env bash
# Pipeline schedules, cohort against PyTorch's torch.distributed.pipelining, in one run
# (BENCHMARKS.md, issue 13). For each pipeline size P (default 2 and 4): pipeline_bench
# under `cohort run` (LibTorch 1.13, this build), then pipeline_peer.py under torchrun on
# PyPI's PyTorch 2.11 (Note [The PyTorch 2 peer] in bench_env.sh), both with stages that sleep
# F, I and W ms per micro-batch (Note [Sleeping stages] in pipeline_bench.cpp), for
# GPipe, 1F1B, interleaved (V = 2) and zero-bubble at m = P, 2P, 4P micro-batches.
# Prints both sides' tables, then per (schedule, P, m) the step times, their ratio
# cohort/PyTorch and each side's bubble against the formula.
#   benchmarks/compare_pipeline.sh [BUILD_DIR] [P...]
# Extra arguments for both programs go in PIPELINE_BENCH_ARGS, e.g.
# PIPELINE_BENCH_ARGS="--warmup 1 --steps 2" for a smoke run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/bench_env.sh"
build=${1:-build}
shift || true
sizes=("$@")
((${#sizes[@]})) || sizes=(2 4)
read -r -a extra <<< "${PIPELINE_BENCH_ARGS:-}"
if [[ $bench_smoke == 1 ]]; then extra=(--warmup 1 --steps 1 --forward-ms 2 --input-ms 2 --weight-ms 2) sizes=(2); fi
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
out=$(mktemp)
trap 'rm -f "$out"' EXIT

py2=$(torch2_python)
peer() {
  GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 "$py2" -u "$here/pipeline_peer.py" --torchrun "$1" "${extra[@]}" | tee -a "$out"
}

for p in "${sizes[@]}"; do
  "$build/tools/cohort/cohort" run --nproc-per-node "$p" --local-ranks-filter 0 \
    "$build/benchmarks/pipeline_bench" "${extra[@]}" | sed 's/^\[rank0\]: //' | tee -a "$out"
  peer "$p"
done

python3 - "$out" <<'PY'
import json, sys

rows = []
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        r = json.loads(line)
        if "schedule" in r:
            rows.append(r)
by = {(r["impl"], r["schedule"], r["P"], r["m"]): r for r in rows}
order = ["gpipe", "1f1b", "interleaved", "zero-bubble", "zbv"]
keys = sorted({(s, p, m) for _, s, p, m in by},
              key=lambda k: (k[1], order.index(k[0]) if k[0] in order else len(order), k[2]))

def fmt(x, spec):
    return "-" if x is None else format(x, spec)

print("\ncohort (LibTorch 1.13) against PyTorch 2.6 torch.distributed.pipelining, same sleeping stages; "
      "step ms = median of the slowest rank; bubble in the formula's convention (frac or ratio); "
      "+ms = step - the formula's step (ideal / (1 - frac) or ideal (1 + ratio))")
print(f"{'schedule':<12}{'P':>3}{'m':>4}{'V':>3}{'cohort ms':>11}{'torch ms':>10}{'c/t':>7}{'formula':>9}"
      f"{'cohort':>9}{'err':>8}{'+ms':>7}{'torch':>9}{'err':>8}{'+ms':>7}  peak live: cohort runtime | torch model")
for s, p, m in keys:
    c, t = by.get(("cohort", s, p, m)), by.get(("torch", s, p, m))
    any_ = c or t
    ratio = c["step_ms"] / t["step_ms"] if c and t else None
    err = lambda r: None if r is None or r.get("rel_err_formula") is None else 100 * r["rel_err_formula"]
    f = any_["formula"]
    step_f = any_["ideal_ms"] * (1 + f) if any_["convention"] == "ratio" else any_["ideal_ms"] / (1 - f)
    over = lambda r: None if r is None else r["step_ms"] - step_f
    print(f"{s:<12}{p:>3}{m:>4}{any_['V']:>3}{fmt(c and c['step_ms'], '.1f'):>11}{fmt(t and t['step_ms'], '.1f'):>10}"
          f"{fmt(ratio, '.3f'):>7}{f:>9.4f}{fmt(c and c['bubble'], '.4f'):>9}{fmt(err(c), '.1f'):>7}%"
          f"{fmt(over(c), '.1f'):>7}{fmt(t and t['bubble'], '.4f'):>9}{fmt(err(t), '.1f'):>7}%{fmt(over(t), '.1f'):>7}  "
          f"{','.join(map(str, c['peak_live'])) if c else '-'} | {','.join(map(str, t['model_peak_live'])) if t else '-'}")
print("cohort/torch (c/t) < 1: cohort's step is shorter; err: (measured - formula) / formula")
PY
