#pragma once
// The environment contract between the launcher and a worker: exactly the variables
// torchrun sets, so a worker cannot tell cohort run from torchrun.
#include <optional>
#include <string>

#include "cohort/comm/environment.h"
#include "cohort/launcher/run_options.h"

namespace cohort::launcher {

// Where one worker stands in the job.
struct WorkerSlot {
  int local_rank = 0;
  int rank = 0;
  int local_world_size = 1;
  int world_size = 1;
  int group_rank = 0;  // node rank
  int group_world_size = 1;
};

// Everything a worker needs to know beyond its slot.
struct AttemptContext {
  std::string store_addr;  // exported as MASTER_ADDR
  int store_port = 0;      // exported as MASTER_PORT
  int restart_count = 0;
  std::string run_id;
  // TORCHELASTIC_MAX_RESTARTS: the job's limit (the elastic rendezvous record's);
  // options.max_restarts when unset.
  std::optional<int> max_restarts;
  // COHORT_FT_INCARNATION of the attempt's first workers: 0, or more for a node
  // started again under --fault-tolerance in-process (Note [A node started again]).
  int first_incarnation = 0;
};

// Note [Variables the launcher owns]
// Beyond the torchrun contract (every variable of which worker_environment sets),
// cohort's launcher tells its workers how to reach its store through variables
// that only it may set. A launcher started inside a worker (a nested `cohort run`)
// inherits them from the outer job, and its workers would follow them to the outer
// job's store and hang; so each mode clears those it does not set itself. The elastic
// agent sets the store's three; the static one clears them. COHORT_CONSOLE_TTY is
// set or cleared per worker (Note [Progress lines]); the COHORT_F* variables of
// --fault-tolerance in-process are set only in that mode.
inline constexpr const char* kLauncherOwnedVariables[] = {
    "COHORT_AGENT_STORE",     "COHORT_STORE_PREFIX",    "COHORT_RDZV_TOKEN",    "COHORT_CONSOLE_TTY",
    "COHORT_REPORT_FILE",     "COHORT_FAULT_TOLERANCE", "COHORT_FT_MIN_REPLICAS", "COHORT_FT_INCARNATION"};

// `env` without kLauncherOwnedVariables, nor PET_RDZV_TOKEN: the base of every
// worker's environment.
comm::EnvMap without_launcher_variables(const comm::EnvMap& env);

// `base` is the launcher's own environment; the result is base plus the contract.
// Under --fault-tolerance in-process it also holds COHORT_FAULT_TOLERANCE=in-process,
// COHORT_FT_MIN_REPLICAS and COHORT_FT_INCARNATION=`incarnation` (0 for a rank's
// first process, k for its k-th replacement), and nothing else differs between the
// incarnations of a rank (Note [A replacement is its rank] in launcher/in_process.h).
comm::EnvMap worker_environment(const comm::EnvMap& base, const RunOptions& options, const WorkerSlot& slot,
                                const AttemptContext& attempt, const std::string& error_file, int incarnation = 0);

}  // namespace cohort::launcher
