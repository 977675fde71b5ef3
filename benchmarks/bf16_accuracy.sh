#!/usr/bin/env bash
# bf16 autocast against float32 at world 2 (BENCHMARKS.md, issue 46): the trainer's
# test accuracy after EPOCHS whole epochs (default 2, as `make run`) from the same
# seed, in float32 and with --amp bf16, one thread per worker. The test
# Trainer.Bf16AutocastTrainsLikeFloat32OverAFractionOfAnEpoch checks a fraction of an
# epoch; this is where the claim "bf16 reaches float32's accuracy" is measured, since
# 2 epochs twice take minutes on 2 cores (Note [Tests sized for a slow, busy machine]
# in tests/multiproc/trainer_test.cpp).
#   benchmarks/bf16_accuracy.sh [BUILD_DIR] [EPOCHS] [SEED]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/bench_env.sh"
build=${1:-build}
epochs=${2:-2}
seed=${3:-4}
limit=()
if [[ $bench_smoke == 1 ]]; then epochs=1 limit=(--limit-train-batches 5); fi
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
cohort=$build/tools/cohort/cohort
trainer=$build/examples/fashion_mnist/fashion_mnist

run() {  # ARGS...: the test accuracy and wall seconds of rank 0's JSON line
  "$cohort" run --nproc-per-node 2 --local-ranks-filter 0 "$trainer" --epochs "$epochs" --seed "$seed" \
    ${limit[@]+"${limit[@]}"} "$@" | grep '{' | sed 's/^\[rank0\]: //' |
    /usr/bin/python3 -c "import json,sys; j=json.loads(sys.stdin.read()); print(j['test_accuracy'], j['wall_seconds'])"
}

read -r fp32 fp32_s < <(run)
read -r bf16 bf16_s < <(run --amp bf16)
echo "world 2, $epochs epochs, seed $seed, one thread per worker"
printf 'float32 test accuracy %.4f (%.0f s)\n' "$fp32" "$fp32_s"
printf 'bf16    test accuracy %.4f (%.0f s)\n' "$bf16" "$bf16_s"
/usr/bin/python3 -c "print('bf16 - float32 test accuracy: %+.4f' % ($bf16 - $fp32))"
