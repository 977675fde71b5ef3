#!/usr/bin/env bash
# examples/gpt against the same model trained by PyTorch's own tensor parallelism and
# DDP (gpt_peer.py, PyPI's torch; Note [The PyTorch 2 peer] in bench_env.sh), in one
# run (BENCHMARKS.md, issue 31). Four parts:
#   1. loss curve: the first STEPS losses at TP 2 from the same initial weights
#      (gpt --save-initial) and batches (gpt --dump-data; Note [The batch rule]), fp32,
#      no dropout: the largest difference between the two sides; and the peer's
#      F.scaled_dot_product_attention against its explicit attention (the GPU run's
#      --attention sdpa), which must agree within 1e-4 or the script fails;
#   2. tokens/s at TP 2 and at DP 2, both sides alternated REPS times after a warm-up
#      run each, medians, once per allocator setting (Note [Equal allocator settings]);
#   3. TP all-reduce bytes of one training step, counted from cohort's timeline,
#      against Megatron's formula;
#   4. peak memory per rank at TP 1 and TP 2 against the formula for parameters,
#      gradients, AdamW's state and activations.
#   benchmarks/compare_gpt.sh [BUILD_DIR] [STEPS] [REPS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/bench_env.sh"
build=${1:-build}
steps=${2:-60}
reps=${3:-3}
if [[ $bench_smoke == 1 ]]; then steps=8 reps=1; fi
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
cohort=$build/tools/cohort/cohort
gpt=$build/examples/gpt/gpt
py2=$(torch2_python)
work=$(mktemp -d /tmp/cohort-compare-gpt.XXXXXX)
trap 'rm -rf "$work"' EXIT
# The model: 4 layers of width 128, 4 heads, context 64, global batch 16, no dropout.
L=4 H=128 S=64 B=16
shape=(--layers $L --embed-dim $H --heads 4 --context $S)
model=("${shape[@]}" --batch-size $B)

cohort_run() {  # SETTING NPROC ARGS...: gpt under cohort run; prints rank 0's output
  local setting=$1 nproc=$2
  shift 2
  # shellcheck disable=SC2046
  env $(malloc_env "$setting") "$cohort" run --nproc-per-node "$nproc" --local-ranks-filter 0 "$gpt" \
    "${shape[@]}" --batch-size "${batch:-$B}" --dropout 0 --samples 0 --eval-every 0 --eval-batches 1 "$@" | sed 's/^\[rank0\]: //'
}
peer_run() {  # SETTING NPROC ARGS...: gpt_peer.py under PyTorch's torchrun
  local setting=$1 nproc=$2
  shift 2
  # shellcheck disable=SC2046
  env $(malloc_env "$setting") "$py2" -m torch.distributed.run --standalone --nproc-per-node "$nproc" \
    "$here/gpt_peer.py" --data "$work" --initial "$work/initial.pt" "${model[@]}" "$@" 2>/dev/null
}
json_field() { /usr/bin/python3 -c 'import json,sys; print(json.loads([l for l in sys.stdin if l.startswith("{")][-1])[sys.argv[1]])' "$1"; }

echo "== data and initial weights (gpt --dump-data, --save-initial)"
cohort_run default 1 --tp 1 --steps 1 --dump-data "$work" --save-initial "$work/initial.pt" >/dev/null

echo "== 1. loss curve at TP 2, $steps steps, fp32"
cohort_run default 2 --tp 2 --steps "$steps" --log-losses | grep -E '^step [0-9]+ loss' >"$work/cohort.losses"
peer_run default 2 --tp 2 --steps "$steps" --log-losses | grep -E '^step [0-9]+ loss' >"$work/peer.losses"
peer_run default 2 --tp 2 --steps "$steps" --log-losses --attention sdpa | grep -E '^step [0-9]+ loss' \
  >"$work/peer-sdpa.losses"
/usr/bin/python3 - "$work/cohort.losses" "$work/peer.losses" <<'PY'
import sys
read = lambda p: [float(l.split()[3]) for l in open(p)]
c, p = read(sys.argv[1]), read(sys.argv[2])
assert len(c) == len(p) and c, f"loss curves of {len(c)} and {len(p)} steps"
d = [abs(a - b) for a, b in zip(c, p)]
print(f"steps {len(c)}: cohort {c[0]:.6f} -> {c[-1]:.6f}, pytorch {p[0]:.6f} -> {p[-1]:.6f}, "
      f"largest difference {max(d):.2e} (step {d.index(max(d)) + 1})")
PY
/usr/bin/python3 - "$work/peer.losses" "$work/peer-sdpa.losses" <<'PY'
import sys
# The same model and batches in float32: SDPA's fused softmax rounds differently from
# the explicit one by about 1e-6 a step; a wrong mask or scale moves the loss by far
# more than 1e-4 from the first step on.
read = lambda p: [float(l.split()[3]) for l in open(p)]
e, f = read(sys.argv[1]), read(sys.argv[2])
assert len(e) == len(f) and e, f"loss curves of {len(e)} and {len(f)} steps"
d = max(abs(a - b) for a, b in zip(e, f))
print(f"pytorch's sdpa against its explicit attention, {len(e)} steps: losses apart by at most {d:.2e}")
sys.exit(0 if d < 1e-4 else f"compare_gpt: sdpa's losses differ from the explicit attention's by {d:.2e}")
PY

echo "== 2. tokens/s (every step's tokens over every step's time, as gpt reports it)"
for setting in "${malloc_settings[@]}"; do
  for layout in "tp 2" "dp 2"; do
    tp=$([[ $layout == "tp 2" ]] && echo 2 || echo 1)
    cohort_rates=() peer_rates=()
    cohort_run "$setting" 2 --tp "$tp" --steps "$steps" >/dev/null
    peer_run "$setting" 2 --tp "$tp" --steps "$steps" >/dev/null
    for ((i = 0; i < reps; i++)); do
      cohort_rates+=("$(cohort_run "$setting" 2 --tp "$tp" --steps "$steps" | json_field tokens_per_second)")
      peer_rates+=("$(peer_run "$setting" 2 --tp "$tp" --steps "$steps" | json_field tokens_per_second)")
    done
    /usr/bin/python3 - "${cohort_rates[*]}" "${peer_rates[*]}" "$layout" "$steps" "$setting" <<'PY'
import statistics, sys
c = [float(x) for x in sys.argv[1].split()]
p = [float(x) for x in sys.argv[2].split()]
print(f"{sys.argv[3]} (world 2), {sys.argv[4]} steps, {len(c)} repetitions, allocator: {sys.argv[5]}: "
      f"cohort {statistics.median(c):.0f} ({' '.join(f'{x:.0f}' for x in c)}), "
      f"pytorch {statistics.median(p):.0f} ({' '.join(f'{x:.0f}' for x in p)}), "
      f"cohort / pytorch {statistics.median(c) / statistics.median(p):.2f}")
PY
  done
done

echo "== 3. TP all-reduce bytes of step 3 at TP 2 (cohort's timeline) against Megatron's formula"
"$cohort" run --nproc-per-node 2 --timeline "$work/timeline" "$gpt" "${model[@]}" --dropout 0 --samples 0 \
    --eval-every 0 --eval-batches 1 --tp 2 --steps 4 >/dev/null
/usr/bin/python3 - "$work/timeline/rank-0.json" "$L" "$H" "$S" "$B" <<'PY'
import collections, json, sys
events = json.load(open(sys.argv[1]))
events = events["traceEvents"] if isinstance(events, dict) else events
L, H, S, B = map(int, sys.argv[2:])
ops = collections.Counter()
for e in events:
    args = e.get("args", {})
    if e.get("cat") == "collective" and e.get("ph") in ("b", "X") and args.get("step") == 3:
        ops[e["name"]] += args.get("bytes", 0)
measured = ops.get("all_reduce", 0)
act = B * S * H * 4  # one fp32 activation of the residual stream
# Megatron: per layer 2 all-reduces forward (attention, MLP) and 2 backward; cohort adds
# the vocabulary-parallel embedding's forward all-reduce, the tied output layer's
# backward one, and the cross-entropy's three of one fp32 number per token.
formula = (4 * L + 2) * act + 3 * B * S * 4
print(f"measured {measured} bytes of all_reduce ({dict(ops)}); formula (4L + 2) b s h x 4 + 3 b s x 4 "
      f"= {formula} bytes; of which Megatron's 4 L b s h x 4 = {4 * L * act}; measured / formula "
      f"{measured / formula:.3f}")
PY

echo "== 4. peak resident memory per rank (MB), AdamW, fp32"
for tp in 1 2; do
  nproc=$tp
  big=$(cohort_run default "$nproc" --tp "$tp" --steps 3 | json_field peak_rss_mb_max_rank)
  small=$(batch=$tp cohort_run default "$nproc" --tp "$tp" --steps 3 | json_field peak_rss_mb_max_rank)
  /usr/bin/python3 - "$tp" "$big" "$small" "$L" "$H" "$S" "$B" <<'PY'
import sys
t = int(sys.argv[1]); big, small = float(sys.argv[2]), float(sys.argv[3])
L, H, S, B = map(int, sys.argv[4:])
V, heads = 2048, 4
params = V * H + S * H + L * (12 * H * H + 13 * H) + 2 * H
sliced = V * H + L * (12 * H * H + 9 * H)  # what TP splits: embedding, q/k/v/fc1 (+bias), proj/fc2
per_rank = params - sliced + sliced / t
state = per_rank * 4 * 4 / 2**20  # weights, gradients, AdamW's two moments, fp32
# Activations kept for backward, Korthikanti et al.'s count in bytes at 2 per number,
# doubled for fp32: s b h (10 + 24 / t + 5 a s / (h t)) per layer, plus the logits'
# slice and its softmax (2 x b s V / t x 4).
acts = L * S * B * H * (10 + 24 / t + 5 * heads * S / (H * t)) * 2 + 2 * B * S * V / t * 4
print(f"tp {t}: peak RSS {big:.0f} MB at batch {B}, {small:.0f} MB at batch {t} (the runtime, weights and state); "
      f"difference {big - small:.0f} MB against activations {acts / 2**20:.0f} MB by the formula; "
      f"parameters, gradients and AdamW's state {state:.1f} MB by the formula")
PY
done
