#!/usr/bin/env bash
# The control plane at N (docs/scale.md): rendezvous and quorums of N agents or
# replicas over cohort's real store (scale_control_bench), then recovery in real
# processes at 4, 8 and 16 replicas (recovery.py). Writes every JSON line to OUT
# (default scale_control.json) and prints a table per measure. Medians of REPEATS
# (default 3) runs; every run must form every round and quorum, or the script fails.
#   benchmarks/scale/run_control.sh BUILD_DIR [OUT] [N ...]     (N default: 8 64 256 1024)
# COHORT_BENCH_SMOKE=1 (scripts/bench-smoke): N = 8 and 64, one run, 3 kills at 4 replicas.
set -euo pipefail
build=${1:?usage: benchmarks/scale/run_control.sh BUILD_DIR [OUT] [N ...]}
out=${2:-scale_control.json}
shift $(( $# >= 2 ? 2 : 1 ))
here=$(cd "$(dirname "$0")" && pwd)
bench=$build/benchmarks/scale/scale_control_bench
[[ -x $bench ]] || { echo "run_control.sh: no $bench (build with COHORT_BUILD_BENCHMARKS=ON)" >&2; exit 2; }
sizes=("$@")
repeats=${REPEATS:-3}
recovery_sizes=(4 8 16)
if [[ ${COHORT_BENCH_SMOKE:-} == 1 ]]; then
  sizes=(8 64) repeats=1 recovery_sizes=(4)
fi
[[ ${#sizes[@]} -gt 0 ]] || sizes=(8 64 256 1024)
: >"$out"
for n in "${sizes[@]}"; do
  for what in rendezvous quorum; do
    timeout 900 "$bench" --what "$what" --n "$n" --repeats "$repeats" | tee -a "$out" >/dev/null
  done
done
timeout 1800 /usr/bin/python3 "$here/recovery.py" "$build" "${recovery_sizes[@]}" | tee "$out.recovery.txt"
grep '^{' "$out.recovery.txt" >>"$out"
rm -f "$out.recovery.txt"
/usr/bin/python3 "$here/summarise.py" "$out"
