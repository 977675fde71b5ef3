#pragma once
// How a worker ended, and the summary the launcher prints when a job fails. Pure.
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "cohort/elastic/error_file.h"
#include "cohort/launcher/worker_env.h"

namespace cohort::launcher {

struct WorkerOutcome {
  WorkerSlot slot;
  pid_t pid = -1;
  int wait_status = 0;
  bool stopped_by_launcher = false;  // it was still running when the launcher stopped it
  std::int64_t exited_at_ms = 0;  // wall-clock, for ordering failures across nodes
  bool frozen = false;  // killed after staying stopped (SIGSTOP) for --frozen-timeout
  // In-process fault tolerance: killed while stopped after training had finished
  // without it (Note [A stopped worker after the end]); counts as succeeded.
  bool killed_after_the_end = false;
  std::optional<elastic::ErrorRecord> error;
  std::string error_file;

  bool succeeded() const;
};

// A worker that failed because a peer did: its error is a cohort::CommError or
// cohort::TimeoutError, or SIGPIPE killed it.
bool is_casualty(const WorkerOutcome& outcome);

// The worker that failed first on its own account (Note [Root cause]); nullptr when
// none did.
const WorkerOutcome* root_cause(const std::vector<WorkerOutcome>& in_exit_order);

struct FailureContext {
  std::string host;
  std::string run_id;
  int attempt = 0;
  int max_restarts = 0;
};

// "exit code 3", "killed by SIGKILL (hung: ...)".
std::string describe_outcome(const WorkerOutcome& outcome);

std::string failure_summary(const std::vector<WorkerOutcome>& in_exit_order, const FailureContext& context);

}  // namespace cohort::launcher
