#include "cohort/launcher/worker_env.h"

#include <sched.h>

#include <algorithm>

namespace cohort::launcher {
namespace {

// Note [NCCL async error handling]
// torchrun turns on NCCL's asynchronous error handling unless the user chose: 1.13
// reads NCCL_ASYNC_ERROR_HANDLING, 2.x reads TORCH_NCCL_ASYNC_ERROR_HANDLING first and
// the old name after it. A worker may run either LibTorch, so both are set: to "1"
// when neither is set, and to the user's value when only one is (so that 2.x does not
// find our "1" under the new name before the user's choice under the old one).
void set_nccl_async_error_handling(comm::EnvMap& env) {
  static constexpr const char* kNew = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
  static constexpr const char* kOld = "NCCL_ASYNC_ERROR_HANDLING";
  const auto fresh = env.find(kNew), old = env.find(kOld);
  if (fresh == env.end() && old == env.end()) {
    env[kNew] = env[kOld] = "1";
  } else if (fresh == env.end()) {
    env[kNew] = old->second;
  } else if (old == env.end()) {
    env[kOld] = fresh->second;
  }
}

// Note [Threads per worker]
// LibTorch's intra-op pool (OpenMP) and OpenBLAS's own pthread pool each want a
// thread per core. With several workers on a node that is workers x cores busy
// threads per pool on `cores` cores, preempting each other in the middle of every
// GEMM. torchrun sets OMP_NUM_THREADS=1 for several workers; we do the same and
// bound OpenBLAS's pool alike (it reads OPENBLAS_NUM_THREADS before
// OMP_NUM_THREADS). A single worker gets every core it may run on: LibTorch's own
// default is the *physical* core count as cpuinfo reports it, which on some VMs is
// 1 of 2. A value the user set is kept, and OpenBLAS follows the user's
// OMP_NUM_THREADS when only that is set. Gloo's threads are not counted against the
// budget: they sleep in the kernel except while a collective moves data, when the
// compute threads are the ones waiting.
void set_thread_policy(comm::EnvMap& env, int local_world_size) {
  auto given = [&](const char* name) {
    auto it = env.find(name);
    return it != env.end() && !it->second.empty();
  };
  std::string threads = "1";
  if (local_world_size <= 1) {
    cpu_set_t set;
    CPU_ZERO(&set);
    const int cores = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    threads = std::to_string(std::max(cores, 1));
  }
  if (!given("OMP_NUM_THREADS")) env["OMP_NUM_THREADS"] = threads;
  if (!given("OPENBLAS_NUM_THREADS")) env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"];
}

}  // namespace

comm::EnvMap without_launcher_variables(const comm::EnvMap& env) {
  comm::EnvMap out = env;
  for (const char* name : kLauncherOwnedVariables) out.erase(name);
  // The token's PET_ spelling (--rdzv-token) is the launcher's input, not the
  // workers': those that need the token get COHORT_RDZV_TOKEN, and under a plain
  // TCPStore (worker_store=tcpstore, static multi-node jobs) none gets it at all.
  out.erase("PET_RDZV_TOKEN");
  return out;
}

comm::EnvMap worker_environment(const comm::EnvMap& base, const RunOptions& options, const WorkerSlot& slot,
                                const AttemptContext& attempt, const std::string& error_file, int incarnation) {
  comm::EnvMap env = base;
  auto set = [&](const char* name, const std::string& value) { env[name] = value; };
  auto set_int = [&](const char* name, int value) { env[name] = std::to_string(value); };
  set_int("LOCAL_RANK", slot.local_rank);
  set_int("RANK", slot.rank);
  set_int("GROUP_RANK", slot.group_rank);
  // One role per job, so the role rank is the global rank.
  set_int("ROLE_RANK", slot.rank);
  set("ROLE_NAME", options.role);
  set_int("LOCAL_WORLD_SIZE", slot.local_world_size);
  set_int("WORLD_SIZE", slot.world_size);
  set_int("GROUP_WORLD_SIZE", slot.group_world_size);
  set_int("ROLE_WORLD_SIZE", slot.world_size);
  set("MASTER_ADDR", attempt.store_addr);
  set_int("MASTER_PORT", attempt.store_port);
  set_int("TORCHELASTIC_RESTART_COUNT", attempt.restart_count);
  set_int("TORCHELASTIC_MAX_RESTARTS", attempt.max_restarts.value_or(options.max_restarts));
  set("TORCHELASTIC_RUN_ID", attempt.run_id);
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  set("TORCHELASTIC_ERROR_FILE", error_file);
  if (in_process_fault_tolerance(options)) {
    set("COHORT_FAULT_TOLERANCE", "in-process");
    set_int("COHORT_FT_MIN_REPLICAS", options.min_replicas.value_or(1));
    set_int("COHORT_FT_INCARNATION", incarnation);
  } else {
    for (const char* name : {"COHORT_FAULT_TOLERANCE", "COHORT_FT_MIN_REPLICAS", "COHORT_FT_INCARNATION"}) env.erase(name);
  }
  set_nccl_async_error_handling(env);
  set_thread_policy(env, slot.local_world_size);
  if (!options.timeline_dir.empty()) {
    set("COHORT_TIMELINE_DIR", options.timeline_dir);
    if (!options.timeline_steps.empty()) set("COHORT_TIMELINE_STEPS", options.timeline_steps);
    if (options.timeline_max_events > 0) set("COHORT_TIMELINE_MAX_EVENTS", std::to_string(options.timeline_max_events));
  }
  return env;
}

}  // namespace cohort::launcher
