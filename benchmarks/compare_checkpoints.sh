#!/usr/bin/env bash
# compare_checkpoints.sh BUILD NPROC STEPS EVERY REPS [fashion|gpt]
# What a checkpoint every N steps costs the Fashion-MNIST trainer (or, with gpt, the
# GPT trainer at --tp NPROC against gpt_peer.py's DTensor tensor parallelism), cohort's
# synchronous and asynchronous checkpoints (docs/checkpoints.md) against PyTorch 2's
# dcp.save and dcp.async_save on the same network, data, batch, world and backend
# (trainer_peer.py on the venv's torch and its torchrun, Gloo on the CPU), in one run (BENCHMARKS.md,
# issue 49). Each side runs without checkpoints, with synchronous ones and with
# asynchronous ones, alternating, REPS times after a warm-up; each run starts from an
# empty checkpoint directory. Per side and mode it prints the median of:
#   rate      samples/s over the training loop with the time saves held it (cohort's
#             trainer leaves checkpoints out of samples_per_second and reports their
#             blocked time; the peer's loop includes them)
#   cost      1 - rate / the same side's rate without checkpoints
#   bound     cohort only: (blocked time + the writer thread's CPU time) / the loop's
#             time, a bound on the cost that the rates' run-to-run spread cannot hide
#   blocked   rank 0's median time held per save, milliseconds
#   rss       rank 0's (cohort: the largest rank's) peak resident memory, MB
#   benchmarks/compare_checkpoints.sh [BUILD_DIR] [NPROC] [STEPS] [EVERY] [REPS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/bench_env.sh"
build=${1:-build}
nproc=${2:-2}
steps=${3:-500}
every=${4:-50}
reps=${5:-3}
which=${6:-fashion}
if [[ $bench_smoke == 1 ]]; then steps=8 every=4 reps=1; fi
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
cohort=$build/tools/cohort/cohort
python=$(torch2_python)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
if [[ $which == gpt ]]; then
  # The GPT of compare_gpt.sh, its data and initial weights shared with the peer.
  trainer=$build/examples/gpt/gpt
  peer=$here/gpt_peer.py
  shape=(--layers 4 --embed-dim 128 --heads 4 --context 64 --batch-size 16)
  common=("${shape[@]}" --tp "$nproc" --steps "$steps")
  cohort_only=(--dropout 0 --samples 0 --eval-every 0 --eval-batches 1)
  peer_only=(--data "$scratch" --initial "$scratch/initial.pt")
  "$cohort" run --nproc-per-node 1 "$trainer" "${shape[@]}" --tp 1 --steps 1 "${cohort_only[@]}" \
    --dump-data "$scratch" --save-initial "$scratch/initial.pt" >/dev/null
  unit="tokens"
else
  trainer=$build/examples/fashion_mnist/fashion_mnist
  peer=$here/trainer_peer.py
  common=(--epochs 1 --batch-size 32 --lr 2e-3 --limit-train-batches "$steps")
  cohort_only=() peer_only=()
  unit="samples"
fi

# run SETTING SIDE MODE: one run's figures as "rate blocked_ms rss_mb"
run() {
  local setting=$1 side=$2 mode=$3 dir
  dir=$(mktemp -d -p "$scratch")
  local args=("${common[@]}")
  if [[ $side == cohort ]]; then
    [[ $mode != none ]] && args+=(--checkpoint-dir "$dir/ckpt" --checkpoint-every "$every")
    [[ $mode == async ]] && args+=(--checkpoint-async)
    # shellcheck disable=SC2046
    env $(malloc_env "$setting") "$cohort" run --nproc-per-node "$nproc" --local-ranks-filter 0 "$trainer" \
      "${args[@]}" "${cohort_only[@]}" | grep '{' | sed 's/^\[rank0\]: //' | /usr/bin/python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
c = r.get("checkpoints") or {}
blocked = c.get("blocked_s", 0.0)
# The GPT trainer counts its saves in tokens_per_second; the Fashion-MNIST one does not.
rate = r["tokens_per_second"] if "tokens_per_second" in r else r["samples"] / (r["train_seconds"] + blocked)
# What the saves took from training at most: the time they held it, and the CPU time
# of the writer thread as if it had all come out of training (docs/checkpoints.md).
loop = r["train_seconds"] + (0.0 if "tokens_per_second" in r else blocked)
bound = (blocked + c.get("writer_cpu_s", 0.0)) / loop if c else 0.0
print(rate, c.get("blocked_ms_median", 0.0), r["peak_rss_mb_max_rank"], bound)'
  else
    [[ $mode != none ]] && args+=(--checkpoint-dir "$dir/ckpt" --checkpoint-every "$every" --checkpoint-mode "$mode")
    # shellcheck disable=SC2046
    # Under the venv's own torchrun, as compare_gpt.sh's peer: c10d's store protocol
    # changed in 2.x, and the 1.13 tree's `cohort run` serves 1.13's.
    env $(malloc_env "$setting") "$python" -m torch.distributed.run --standalone --nproc-per-node "$nproc" \
      "$peer" "${args[@]}" "${peer_only[@]}" 2>/dev/null | grep '{' | /usr/bin/python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
rss = r.get("rss_mb_end")
rate = r["tokens_per_second"] if "tokens_per_second" in r else r["samples_per_second"]
print(rate, r.get("checkpoint_blocked_ms_median") or 0.0, rss if rss is not None else 0.0, "nan")'
  fi
  rm -rf "$dir"
}

for setting in "${malloc_settings[@]}"; do
  results=$scratch/results-$setting
  : >"$results"
  run "$setting" cohort none >/dev/null  # warm-up: page cache, first-touch
  run "$setting" pytorch none >/dev/null
  for ((i = 0; i < reps; i++)); do
    for mode in none sync async; do
      echo "cohort $mode $(run "$setting" cohort "$mode")" >>"$results"
      echo "pytorch $mode $(run "$setting" pytorch "$mode")" >>"$results"
    done
  done
  /usr/bin/python3 - "$results" "$nproc" "$steps" "$every" "$setting" "$reps" "$which" "$unit" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    side, mode, rate, blocked, rss, bound = line.split()
    rows[side, mode].append((float(rate), float(blocked), float(rss), float(bound)))
what = "batch 32 per rank" if sys.argv[7] == "fashion" else f"the GPT at TP {sys.argv[2]}"
print(f"{sys.argv[7]}: world {sys.argv[2]}, {sys.argv[3]} steps of {what}, a checkpoint every {sys.argv[4]} steps, "
      f"{sys.argv[6]} repetitions, allocator: {sys.argv[5]}, rate in {sys.argv[8]}/s")
print(f"{'side':8} {'mode':6} {'rate':>8} {'cost':>7} {'bound':>6} {'blocked ms':>11} {'rss MB':>7}  rates")
for side, label in (("cohort", "cohort"), ("pytorch", "pytorch")):
    base = statistics.median(r[0] for r in rows[side, "none"])
    for mode in ("none", "sync", "async"):
        runs = rows[side, mode]
        rate = statistics.median(r[0] for r in runs)
        blocked = statistics.median(r[1] for r in runs)
        rss = statistics.median(r[2] for r in runs)
        cost = "" if mode == "none" else f"{100 * (1 - rate / base):6.1f}%"
        bound = statistics.median(r[3] for r in runs)
        bound = "" if mode == "none" or bound != bound else f"{100 * bound:5.2f}%"
        print(f"{label:8} {mode:6} {rate:8.0f} {cost:>7} {bound:>6} {blocked:11.1f} {rss:7.0f}  "
              + " ".join(f"{r[0]:.0f}" for r in runs))
PY
done
