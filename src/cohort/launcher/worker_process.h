#pragma once
// One worker as an operating-system process: spawned in its own process group with
// its stdout and stderr on pipes, stdin on /dev/null and no other descriptor (Note
// [Closing descriptors] in worker_process.cpp), and tied to the launcher's life.
//
// Note [No orphans]
// Each worker asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG),
// so a launcher that is killed -9 takes its workers with it. The request is made
// between fork and exec; if the launcher died in that window the child sees a new
// parent and exits at once. Workers lead their own process group: stopping a worker
// signals the group, and when a worker exits the launcher kills what is left of its
// group, so helpers it forked (data loaders) do not outlive it. One gap remains: if
// the launcher is killed -9, a worker dies by PDEATHSIG but its own children survive
// unless they ask for PDEATHSIG themselves. PDEATHSIG fires when the *thread* that
// forked exits, so workers must be spawned from the launcher's main thread.
#include <sys/types.h>

#include <string>
#include <vector>

#include "cohort/comm/environment.h"

namespace cohort::launcher {

struct SpawnRequest {
  std::string program;  // absolute or relative path, already resolved
  std::vector<std::string> args;
  comm::EnvMap env;
};

class WorkerProcess {
 public:
  // Throws cohort::Error if the process could not be created or exec failed.
  static WorkerProcess spawn(const SpawnRequest& request);

  pid_t pid() const { return pid_; }
  int stdout_fd() const { return out_fd_; }
  int stderr_fd() const { return err_fd_; }
  // Sends `signal` to the worker's process group; harmless if it is gone.
  void signal_group(int signal) const;

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
};

// Describes a wait status: "exit code 3", "signal SIGKILL (9)".
std::string describe_status(int wait_status);

}  // namespace cohort::launcher
