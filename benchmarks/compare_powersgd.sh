#!/usr/bin/env bash
# PowerSGD against the plain all-reduce (docs/ddp.md#powersgd): the trainer on 2
# processes for EPOCHS epochs (default 2) with each --comm-hook, the same seed; prints
# the test accuracy and the elements each rank sent in the last step (BENCHMARKS.md).
# Accuracy and element counts do not depend on the machine's load.
#   benchmarks/compare_powersgd.sh [BUILD_DIR] [EPOCHS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/bench_env.sh"
build=${1:-build}
epochs=${2:-2}
limit=()
if [[ $bench_smoke == 1 ]]; then epochs=1 limit=(--limit-train-batches 5); fi
export GLOO_SOCKET_IFNAME=lo
for hook in allreduce powersgd:1 powersgd:4; do
  line=$("$build/tools/cohort/cohort" run --nproc-per-node 2 --local-ranks-filter 0 \
    "$build/examples/fashion_mnist/fashion_mnist" --epochs "$epochs" --comm-hook "$hook" --seed 1 "${limit[@]}" |
    sed -n 's/^\[rank0\]: \({.*}\)$/\1/p' | tail -n 1)
  /usr/bin/python3 -c '
import json, sys
hook, d = sys.argv[1], json.loads(sys.argv[2])
p = d.get("powersgd", {})
sent = p.get("elements_sent_last_step")
dense = p.get("elements_of_plain_all_reduce")
print(json.dumps({"comm_hook": hook, "test_accuracy": d["test_accuracy"], "test_loss": d["test_loss"],
                  "elements_sent_last_step": sent, "elements_of_plain_all_reduce": dense,
                  "samples_per_second": d.get("samples_per_second")}))' "$hook" "$line"
done
