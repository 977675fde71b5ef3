# Sourced by the benchmark scripts: what every side-by-side run shares.
#
# COHORT_BENCH_SMOKE=1 makes each script do its smallest complete run (one repetition,
# a few steps): scripts/bench-smoke runs every script that way in CI, so that none can
# rot unseen (issue 29). Smoke figures mean nothing; only that every side still runs
# and every table still fills.
#
# Note [Stock workers under cohort run]: cohort's own store admits only workers that
# reach it through cohort (docs/store_security.md). A Python peer calls c10d's
# init_process_group, which speaks c10d's plain TCPStore protocol, so every peer is
# started with `--rdzv-conf worker_store=tcpstore`, as a user of torchrun would run it
# under cohort. Forgetting it made every peer script fail at once (issue 29, item 21).
#
# Note [Equal allocator settings]: glibc's malloc returns blocks above its mmap
# threshold to the kernel on free, and Python's torch allocates and frees its
# activations every step; on these VMs that alone made the Python peer 4x slower
# (43 ms a step instead of 10.9), while cohort was unaffected. COHORT_BENCH_MALLOC
# says which settings a comparison runs under: `default` (glibc's), `equal` (both
# sides with the thresholds raised to 1 GB, so neither side pays the kernel for its
# activations), or `both` (each figure twice; the scripts' default). Each table names
# its setting.
peer_conf=(--rdzv-conf worker_store=tcpstore)
bench_smoke=${COHORT_BENCH_SMOKE:-0}
bench_malloc=${COHORT_BENCH_MALLOC:-both}
case $bench_malloc in
  default) malloc_settings=(default) ;;
  equal) malloc_settings=(equal) ;;
  both) malloc_settings=(default equal) ;;
  *) echo "COHORT_BENCH_MALLOC must be default, equal or both, not '$bench_malloc'" >&2; exit 2 ;;
esac

# malloc_env SETTING: the environment assignments of that setting, for `env`.
malloc_env() {
  case $1 in
    default) echo "COHORT_BENCH_MALLOC_SETTING=default" ;;
    equal) echo "COHORT_BENCH_MALLOC_SETTING=equal MALLOC_MMAP_THRESHOLD_=1000000000 MALLOC_TRIM_THRESHOLD_=1000000000" ;;
  esac
}

# Note [The PyTorch 2 peer]: the peers that need PyTorch 2 (torch.distributed.pipelining,
# FSDP; 1.13's FSDP does not import under Python 3.11) run on PyPI's torch, in the venv
# that scripts/pypi-torch makes (made on first use; COHORT_PEER_TORCH picks the
# version, 2.11.0 by default, the GPU machine's), or on COHORT_PEER_PYTHON when set.
# They used to run on Debian 13's PyTorch 2.6 in a chroot, which CI no longer makes.
torch2_python() {
  if [[ -n ${COHORT_PEER_PYTHON:-} ]]; then
    echo "$COHORT_PEER_PYTHON"
    return
  fi
  "$(dirname "${BASH_SOURCE[0]}")/../scripts/pypi-torch" --venv-only "${COHORT_PEER_TORCH:-2.11.0}" | tail -n 1
}
