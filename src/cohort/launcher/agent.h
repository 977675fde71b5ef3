#pragma once
// The local agent behind `cohort run`: it starts this node's workers, carries their
// output, watches them, and stops them all when one fails or when it is signalled.
// Every wait is bounded: a failure stops the others with SIGTERM and, after
// --stop-timeout seconds, SIGKILL.
#include "cohort/comm/environment.h"
#include "cohort/launcher/run_options.h"

namespace cohort::launcher {

struct HostResources {
  int cpu_count = 1;
  int gpu_count = 0;
};
HostResources detect_resources();

// Runs the job and returns the launcher's exit code: 0 when every worker exits 0,
// 1 when the job failed (a summary is printed to stderr), 128+N when the launcher
// was stopped by signal N. Throws UsageError for input that fails before anything
// starts (missing program, busy port).
int run_agent(const RunOptions& options, const comm::EnvMap& env, const HostResources& resources);

}  // namespace cohort::launcher
