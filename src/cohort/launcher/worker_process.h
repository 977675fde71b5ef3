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
// group, so helpers it forked (data loaders) do not outlive it. PDEATHSIG fires when
// the *thread* that forked exits, so workers must be spawned from the launcher's main
// thread.
//
// PDEATHSIG reaches the worker only, not its children (a wrapper script's trainer,
// a Python subprocess). So `cohort run` also starts a reaper (start_orphan_reaper): a
// small process forked at start, which holds one end of a socket pair whose other end
// only the launcher holds. The launcher tells it each worker's process group when the
// worker starts, and again once it has reaped the worker and killed what was left of
// the group. When the launcher dies, however it dies, the connection ends, and the reaper
// kills every group it still holds with SIGKILL and exits. It ignores the terminal's
// signals, so a Ctrl-C goes through the launcher's own orderly stop.
// What is covered: every process that stays in a worker's process group. What is
// not: a process that leaves it (setsid(), a daemon, a shell with job control,
// which gives each pipeline its own group), and a `kill -9` of the launcher's whole
// process group, which takes the reaper with it (the workers still die by
// PDEATHSIG). A group is forgotten right after it is killed, so the reaper never
// signals a process group id that the kernel may have given to a stranger, but for
// the moment between the two.
#include <sys/resource.h>
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
  // After the worker is reaped and its group killed: the reaper forgets the group
  // (Note [No orphans]).
  void release_group() const;

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
};

// Note [Open files limit]
// The agent that hosts the store holds about two connections per worker of the job,
// its workers' pipes and the logs; at a soft RLIMIT_NOFILE of 1024 (a common default)
// or lower it runs out, and then neither accepts peers nor reads /proc for the
// frozen-worker watchdog. So `cohort run` raises its soft limit to the hard one at
// start, as a server would; each worker gets back the soft limit the launcher was
// started with (programs that use select() rely on it staying small). Returns the
// soft limit now in force.
rlim_t raise_open_files_limit();

// Forks the reaper of Note [No orphans]; once per process, from the main thread,
// before any worker starts. Without it (a failed fork, or a program that never calls
// it) workers still die with the launcher by PDEATHSIG, but not their children.
void start_orphan_reaper();
// Tells the reaper the launcher is done and waits (at most 2 s) until it has exited,
// so that no process of the job outlives a `cohort run` that returned. Harmless
// without a reaper.
void stop_orphan_reaper();

// Describes a wait status: "exit code 3", "signal SIGKILL (9)".
std::string describe_status(int wait_status);

}  // namespace cohort::launcher
