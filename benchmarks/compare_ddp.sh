#!/usr/bin/env bash
# DDP training, cohort against PyTorch's own DDP, in one run (BENCHMARKS.md):
#   1. throughput: steps/s of the three models of bench_models.h, without DDP
#      (world 1) and with DDP at worlds 1, 2, 4, ... up to NPROC, both sides, over
#      ROUNDS rounds (Note [Interleaved rounds]);
#   2. overhead: cohort DDP against local training at world 1, alternating
#      repetitions in one process; overlap: cohort's per-bucket timings for the
#      deep model at world 2;
#   3. memory: peak RSS of local, DDP and DDP with gradient_as_bucket_view on the
#      deep model, each in a fresh process, worlds 1 and 2, both sides.
# Both sides are started by `cohort run`, use Gloo on lo and one thread per rank.
# Prints every JSON line, then summary tables.
#   benchmarks/compare_ddp.sh [BUILD_DIR] [NPROC] [ROUNDS]
# Throughput and the world-1 overhead run once per allocator setting (Note [Equal
# allocator settings] in bench_env.sh), each table naming its setting.
# Extra arguments for both throughput programs go in DDP_BENCH_ARGS;
# COHORT_BENCH_SMOKE=1 runs every part with a few steps and 2 rounds.
#
# Note [Interleaved rounds]: one run of each side said little. On 12-02 two runs of
# the same build a few minutes apart gave cohort/torch 1.18/1.06/0.99 and then
# 0.94/0.89/0.89 at world 2 (issue 48, item 4), and on a shared 2-core VM one
# process's median moves by 30 % from one run to the next. So each configuration
# (setting, world, mode) runs ROUNDS times per side, each run a fresh process with
# its own warm-up, the sides alternating c p, p c, c p, ... so that neither always
# runs first (on a warm cache, or just after the other side's sockets closed), and
# the rounds are the outer loop, so that a machine that drifts over minutes
# affects every configuration of a round alike. The tables give per side the
# median over rounds and its range, and the ratio of each round's adjacent pair.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/bench_env.sh"
build=${1:-build}
nproc=${2:-2}
rounds=${3:-5}
python=/usr/bin/python3   # Debian's python3-torch
bench=$build/benchmarks/ddp_bench
peer=$here/ddp_peer.py
read -r -a extra <<< "${DDP_BENCH_ARGS:-}"
overhead_reps=9 measured=(--warmup 5 --steps 10) overlap_args=()
if [[ $bench_smoke == 1 ]]; then
  extra=(--steps 2 --reps 1 --warmup 1) overhead_reps=1 measured=(--warmup 1 --steps 2)
  overlap_args=(--warmup 1 --steps 2) rounds=2
fi
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# run WORLD PROGRAM ARGS...: rank 0's JSON lines, echoed and kept. A Python peer is
# a stock c10d worker (Note [Stock workers under cohort run] in bench_env.sh).
# BENCH_MALLOC (exported by run_in) tags each JSON line with its allocator setting,
# BENCH_TAG with its round and place in it; "load" is the machine's 1-minute load
# average as the run starts, so that figures taken on a busy machine say so.
run() {
  local world=$1
  shift
  local conf=() load
  [[ $1 == "$python" ]] && conf=("${peer_conf[@]}")
  read -r load _ < /proc/loadavg
  "$build/tools/cohort/cohort" run --nproc-per-node "$world" --local-ranks-filter 0 "${conf[@]}" "$@" |
    sed 's/^\[rank0\]: //' |
    sed "s/^{/{\"malloc\":\"${BENCH_MALLOC:-default}\",\"load\":$load,${BENCH_TAG:-}/" | tee -a "$out"
}

# run_in SETTING WORLD PROGRAM ARGS...: run under that allocator setting.
run_in() {
  local setting=$1
  shift
  # shellcheck disable=SC2046
  (export $(malloc_env "$setting") BENCH_MALLOC=$setting; run "$@")
}

worlds=(1)
for ((w = 2; w <= nproc; w *= 2)); do worlds+=("$w"); done
[[ " ${worlds[*]} " == *" $nproc "* ]] || worlds+=("$nproc")
pair=$((nproc >= 2 ? 2 : 1))

# The throughput runs: for each round, setting and configuration, one fresh process
# per side, the side that goes first alternating from round to round.
for ((round = 1; round <= rounds; round++)); do
  order=(cohort torch)
  ((round % 2 == 0)) && order=(torch cohort)
  for setting in "${malloc_settings[@]}"; do
    for config in local "${worlds[@]}"; do
      world=$config mode=ddp
      [[ $config == local ]] && world=1 mode=local
      for side in "${order[@]}"; do
        prog=("$bench")
        [[ $side == torch ]] && prog=("$python" "$peer")
        BENCH_TAG="\"round\":$round,\"first\":\"${order[0]}\"," \
          run_in "$setting" "$world" "${prog[@]}" throughput --mode "$mode" "${extra[@]}"
      done
    done
  done
done
for setting in "${malloc_settings[@]}"; do
  run_in "$setting" 1 "$bench" overhead --reps "$overhead_reps" "${overlap_args[@]}"
done

# The bench batch (16), then a larger one: overlap depends on how long backward is
# against how long the all-reduce takes, and on 2 cores the two compete for CPU.
run "$pair" "$bench" overlap --model deep "${overlap_args[@]}"
run "$pair" "$bench" overlap --model deep --batch 64 "${overlap_args[@]}"

# Large blocks go straight to mmap and back to the kernel when freed, so RSS follows
# the live tensors instead of what malloc keeps cached.
for w in $(printf '%s\n' 1 "$pair" | sort -u); do
  for config in local ddp ddp-view; do
    MALLOC_MMAP_THRESHOLD_=65536 run "$w" "$bench" memory --mode "$config" "${measured[@]}"
    MALLOC_MMAP_THRESHOLD_=65536 run "$w" "$python" "$peer" memory --mode "$config" "${measured[@]}"
  done
done

"$python" - "$out" <<'PY'
import json, os, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
settings = list(dict.fromkeys(r["malloc"] for r in rows if "steps_per_s" in r))
rounds = len({r["round"] for r in rows if "steps_per_s" in r})

def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)

def ratio(a, b):
    return a / b if a is not None and b else None

def table(title, values, faster, ratios):
    print(f"\n{title}")
    print(f"{'model':<6}{'world':>6}{'local':>9}{'torch-local':>12}{'cohort-ddp':>11}{'torch-ddp':>10}"
          f"{ratios[0]:>13}{ratios[1]:>18}")
    for m in models:
        local, tlocal = values.get(("local", m, 1)), values.get(("torch-local", m, 1))
        for w in worlds:
            c, t = values.get(("cohort-ddp", m, w)), values.get(("torch-ddp", m, w))
            print(f"{m:<6}{w:>6}{fmt(local, '.2f'):>9}{fmt(tlocal, '.2f'):>12}{fmt(c, '.2f'):>11}{fmt(t, '.2f'):>10}"
                  f"{fmt(faster(c, t), '.2f'):>13}{fmt(faster(local, tlocal), '.2f'):>18}")

for setting in settings:
    print(f"\n### Allocator: {setting}" + (" (MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ 1e9, both sides)"
                                            if setting == "equal" else " (glibc's defaults)"))
    mine = [r for r in rows if r.get("malloc") == setting]
    # (impl, model, world) -> {round: the run's figure}; each run's figure is the
    # median of its repetitions, each table's the median over rounds.
    per_round = {}
    for r in (r for r in mine if "steps_per_s" in r):
        per_round.setdefault((r["impl"], r["model"], r["world"]), {})[r["round"]] = r
    def over_rounds(key):
        return {k: statistics.median(r[key] for r in runs.values()) for k, runs in per_round.items()}
    rate, cpu = over_rounds("steps_per_s"), over_rounds("cpu_ms_per_step")
    models = list(dict.fromkeys(m for _, m, _ in rate))
    worlds = sorted({w for i, _, w in rate if i.endswith("ddp")})
    # In both tables a ratio above 1 means cohort is faster (or uses less CPU).
    table(f"Throughput, steps/s (median over {rounds} rounds of each run's median of repetitions; "
          "the local columns are world 1)", rate, ratio, ("cohort/torch", "local/torch-local"))
    table("CPU time per step, ms (rank 0's process, every thread)", cpu, lambda c, t: ratio(t, c),
          ("torch/cohort", "torch-local/local"))

    # The spread: each round's cohort run against the torch run beside it.
    print(f"\nSpread over {rounds} rounds, steps/s: median [min-max] per side; cohort/torch in each round "
          "(* where torch ran first), their median and minimum, and the rounds cohort led; then the same "
          "round's ratio of CPU time per step, torch/cohort (less disturbed by other load), median and minimum")
    print(f"{'model':<6}{'mode':>6}{'world':>6}{'cohort':>22}{'torch':>22}   {'per round':<{7 * rounds}}"
          f"{'median':>7}{'min':>6}{'led':>6}{'cpu med':>8}{'min':>6}")
    led_everywhere = True
    for m in models:
        for mode, w, c_impl, t_impl in [("local", 1, "local", "torch-local")] + \
                [("ddp", w, "cohort-ddp", "torch-ddp") for w in worlds]:
            c, t = per_round.get((c_impl, m, w), {}), per_round.get((t_impl, m, w), {})
            both = sorted(set(c) & set(t))
            if not both:
                continue
            def side(runs):
                xs = [r["steps_per_s"] for r in runs.values()]
                return f"{statistics.median(xs):.1f} [{min(xs):.1f}-{max(xs):.1f}]"
            ratios = [c[i]["steps_per_s"] / t[i]["steps_per_s"] for i in both]
            marks = "".join(f"{x:.2f}{'*' if c[i]['first'] == 'torch' else ' '} " for i, x in zip(both, ratios))
            cpu_ratios = [t[i]["cpu_ms_per_step"] / c[i]["cpu_ms_per_step"] for i in both]
            led = sum(x > 1 for x in ratios)
            led_everywhere &= led == len(ratios)
            print(f"{m:<6}{mode:>6}{w:>6}{side(c):>22}{side(t):>22}   {marks:<{7 * rounds}}"
                  f"{statistics.median(ratios):>7.2f}{min(ratios):>6.2f}{f'{led}/{len(ratios)}':>6}"
                  f"{statistics.median(cpu_ratios):>8.2f}{min(cpu_ratios):>6.2f}")
    print(f"cohort faster in every round, every model and world: {'yes' if led_everywhere else 'no'}")
    loads = [r["load"] for runs in per_round.values() for r in runs.values()]
    print(f"1-minute load average as the runs started: {min(loads):.2f}-{max(loads):.2f} "
          f"(median {statistics.median(loads):.2f}), {len(os.sched_getaffinity(0))} cores")

    print("\nDDP overhead at world 1: extra time per step against the same side's local training, %")
    print(f"{'model':<6}{'cohort wall':>12}{'cohort cpu':>11}{'torch wall':>11}{'torch cpu':>10}")
    for m in models:
        cols = []
        for local, ddp in (("local", "cohort-ddp"), ("torch-local", "torch-ddp")):
            wall = ratio(rate.get((local, m, 1)), rate.get((ddp, m, 1)))
            busy = ratio(cpu.get((ddp, m, 1)), cpu.get((local, m, 1)))
            cols += [None if x is None else (x - 1) * 100 for x in (wall, busy)]
        print(f"{m:<6}" + "".join(f"{fmt(x):>{w}}" for x, w in zip(cols, (12, 11, 11, 10))))

    over = [r for r in mine if r.get("kind") == "overhead"]
    if over:
        print("\nDDP overhead at world 1, cohort, one process alternating local and DDP repetitions: "
              "median over pairs of (DDP time / local time - 1), %")
        print(f"{'model':<6}{'median':>8}{'min':>8}{'max':>8}")
        for r in over:
            print(f"{r['model']:<6}{r['overhead_pct']:>8.2f}{r['min_pct']:>8.2f}{r['max_pct']:>8.2f}")

buckets = [r for r in rows if r.get("kind") == "overlap"]
for s in (r for r in rows if r.get("kind") == "overlap-summary"):
    print(f"\nOverlap, cohort DDP, {s['model']} (batch {s['batch']}) at world {s['world']}: median over "
          f"{s['steps']} steps, ms relative to the end of backward (negative: hidden behind it)")
    print(f"{'bucket':>6}{'MB':>7}{'ready':>9}{'launched':>10}{'done':>9}")
    for b in (b for b in buckets if b["batch"] == s["batch"]):
        print(f"{b['bucket']:>6}{b['mb']:>7.2f}{b['ready_ms']:>9.2f}{b['launched_ms']:>10.2f}{b['done_ms']:>9.2f}")
    print(f"backward {s['backward_ms']:.2f} ms, then {s['wait_after_backward_ms']:.2f} ms waiting for buckets; "
          f"hidden fraction {s['hidden_fraction']:.3f} (min {s['hidden_min']:.3f}, max {s['hidden_max']:.3f})")

mem = {(r["impl"], r["world"], r["config"]): r for r in rows if r.get("kind") == "memory"}
if mem:
    print("\nMemory, deep model: peak RSS (VmHWM), MB; deltas against the same side's local run, "
          "also in gradient copies")
    print(f"{'impl':<7}{'world':>6}{'config':>10}{'peak':>9}{'+MB':>7}{'copies':>8}"
          f"{'steady':>9}{'+MB':>7}{'copies':>8}")
    for (impl, w, config), r in sorted(mem.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        base = mem.get((impl, w, "local"))
        cols = []
        for key in ("peak_mb", "steady_peak_mb"):
            delta = None if base is None or r[key] is None else r[key] - base[key]
            cols.append(f"{fmt(r[key]):>9}{fmt(delta):>7}{fmt(ratio(delta, r['grad_mb']), '.2f'):>8}")
        print(f"{impl:<7}{w:>6}{config:>10}" + "".join(cols))
    print(f"gradients: {next(iter(mem.values()))['grad_mb']:.2f} MB; peak covers the whole run (set-up, "
          "first backward, bucket rebuild), steady the steps after warm-up")
PY
