#pragma once
// The local agent behind `cohort run`: it starts this node's workers, carries their
// output, watches them, and stops them all when one fails or when it is signalled.
// Every wait is bounded: a failure stops the others with SIGTERM and, after
// --stop-timeout seconds, SIGKILL.
#include <filesystem>
#include <string>

#include "cohort/comm/environment.h"
#include "cohort/launcher/run_options.h"

namespace cohort::launcher {

struct HostResources {
  int cpu_count = 1;
  int gpu_count = 0;
};
HostResources detect_resources();

// The folder of a run's per-attempt error files and logs, 0700 (Note [The run
// directory] in agent.cpp): under --log-dir when given (kept, as when --redirects or
// --tee ask for logs), else a temporary one removed by the destructor. Throws
// UsageError when it cannot be made.
class RunDirectory {
 public:
  RunDirectory(const RunOptions& options, const std::string& run_id);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;
  // Makes --log-dir if needed; throws UsageError when it cannot be made or written.
  static void check_log_dir(const RunOptions& options);
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path attempt(int n) const { return path_ / ("attempt_" + std::to_string(n)); }

 private:
  bool keep_;
  std::filesystem::path path_;
};

// Runs the job and returns the launcher's exit code: 0 when every worker exits 0,
// 1 when the job failed (a summary is printed to stderr), 128+N when the launcher
// was stopped by signal N. Throws UsageError for input that fails before anything
// starts (missing program, busy port).
int run_agent(const RunOptions& options, const comm::EnvMap& env, const HostResources& resources);

}  // namespace cohort::launcher
