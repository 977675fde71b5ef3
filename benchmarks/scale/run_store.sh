#!/usr/bin/env bash
# cohort's store against c10d's TCPStore at N clients (docs/scale.md, "The store"):
# both stores at each N, interleaved (cohort at N=8, tcpstore at N=8, cohort at 64,
# ...), from one binary, so the same LibTorch's TCPStore is the peer. Build it
# against PyTorch 2.11 for the comparison that matters (libuv TCPStore; the default
# build's LibTorch 1.13 has the classic one), see docs/scale.md.
# Writes one JSON line per (store, N, op) to $SCALE_STORE_JSON (default
# scale_store.json), then prints a table of both side by side.
#   benchmarks/scale/run_store.sh BUILD_DIR [N...]     (default N: 8 64 256 1024)
# COHORT_BENCH_SMOKE=1: N = 8 and 64, a few operations, one repeat (under 30 s).
# Extra arguments for the binary: SCALE_STORE_ARGS="--repeats 5".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: benchmarks/scale/run_store.sh BUILD_DIR [N...]}
shift
bin=$build/benchmarks/scale/scale_store_bench
[[ -x $bin ]] || { echo "run_store.sh: no $bin (configure with -DCOHORT_BUILD_BENCHMARKS=ON)" >&2; exit 2; }
ns=("$@")
extra=()
if [[ ${COHORT_BENCH_SMOKE:-0} == 1 ]]; then
  (( ${#ns[@]} > 0 )) || ns=(8 64)
  extra=(--smoke)
fi
(( ${#ns[@]} > 0 )) || ns=(8 64 256 1024)
out=${SCALE_STORE_JSON:-scale_store.json}
read -r -a user_args <<<"${SCALE_STORE_ARGS:-}"
: >"$out"
for n in "${ns[@]}"; do
  for store in cohort tcpstore; do
    echo "run_store.sh: $store, $n clients; uptime:$(uptime | sed 's/.*load average//')" >&2
    "$bin" --store "$store" --clients "$n" "${extra[@]}" "${user_args[@]}" >>"$out"
  done
done
/usr/bin/python3 "$here/store_table.py" "$out"
