#pragma once
// One attempt of this node's workers: spawn them, carry their output, watch them,
// and stop them all when one fails or the launcher is signalled. The static agent
// runs one per restart; the elastic agent will run one per rendezvous round.
//
// Every wait is bounded. After a worker failure the others get a settle window
// (Note [Root cause]), then SIGTERM, then SIGKILL after --stop-timeout; unless
// on_worker_failure() says to replace the dead worker alone, or to leave its slot
// empty (--fault-tolerance in-process, launcher/in_process.h).
#include <signal.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cohort/comm/environment.h"
#include "cohort/launcher/failure.h"
#include "cohort/launcher/in_process.h"
#include "cohort/launcher/output_router.h"
#include "cohort/launcher/run_options.h"
#include "cohort/launcher/static_rendezvous.h"
#include "cohort/launcher/worker_env.h"
#include "cohort/launcher/worker_process.h"

namespace cohort::launcher {

struct AttemptResult {
  bool success = false;
  int received_signal = 0;  // a signal the launcher received, forwarded to the workers
  bool interrupted = false;  // stopped because the tick asked (a membership change)
  std::vector<WorkerOutcome> in_exit_order;
};

class WorkerGroup {
 public:
  // Spawns `nproc` workers of `program`; each gets a folder under `dir` for its error
  // file and logs (when it cannot be created, a warning, and the console only: Note
  // [Logs never stop the job]). `signal_fd` is the read end of the launcher's signal self-pipe
  // (one byte per signal). If spawning fails midway, the started workers are killed.
  WorkerGroup(const RunOptions& options, const comm::EnvMap& env, const std::string& program,
              const Assignment& assignment, int nproc, const AttemptContext& context,
              const std::filesystem::path& dir, int signal_fd);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Called every --monitor-interval while the workers run; returning true stops
  // them all (SIGTERM, then SIGKILL after --stop-timeout) without counting as a
  // failure. What it throws propagates out of monitor(), and the workers are killed.
  void on_tick(std::function<bool()> tick) { tick_ = std::move(tick); }

  // Called at once when a worker exits with a non-zero code or by a signal, unless
  // the group is already stopping (a signal to the launcher, or an earlier failure);
  // `incarnation` counts the worker's replacements. kReplace starts a replacement of
  // that worker alone, at once (Note [A replacement is its rank]); kLeave leaves its
  // slot empty; kStopAll (and no callback) stops every worker. Under --fault-tolerance
  // in-process the group also never kills a stopped worker (Note [Frozen workers]).
  using FailureCallback = std::function<FailureAction(const WorkerOutcome&, int incarnation)>;
  void on_worker_failure(FailureCallback decide) { on_failure_ = std::move(decide); }

  // Under --fault-tolerance in-process: the step at which training finished, if it
  // has; a worker stopped for --frozen-timeout after it is killed and counted as done
  // (Note [A stopped worker after the end] in launcher/in_process.h).
  void on_training_finished(std::function<std::optional<std::int64_t>()> finished_at) {
    finished_at_ = std::move(finished_at);
  }

  // Runs until every worker has exited and its output is drained. Success means no
  // signal to the launcher and the last incarnation of every worker exited 0.
  AttemptResult monitor();

  // What the workers left for the launcher's summary in COHORT_REPORT_FILE (rank 0's
  // straggler report); empty when nothing was written. print_report() puts it on
  // stderr under a heading.
  std::string report() const;
  void print_report() const;

 private:
  struct Worker {
    WorkerProcess process;
    WorkerOutcome outcome;
    bool exited = false;
    std::chrono::steady_clock::time_point stopped_since{};  // epoch: not seen stopped
    int incarnation = 0;        // 0, then 1 for its first replacement, ...
    bool frozen_noted = false;  // in-process mode said it is stopped (once per stop)
  };
  using Clock = std::chrono::steady_clock;

  Worker spawn_one(int local, int incarnation);
  void replace(Worker& dead);
  void make_log_dirs(const std::filesystem::path& dir, int nproc);
  bool shown_on_console(bool redirected, const WorkerSlot& slot) const;
  bool console_is_tty(int console) const;
  void route(int source, int console, bool redirected, bool teed, const std::filesystem::path& log,
             const WorkerSlot& slot);
  int running() const;
  void begin_stop(int sig, bool settle);
  void send_stop();
  void kill_remaining();
  void kill_and_reap_all();
  void drain_signals(AttemptResult& result);
  void reap(AttemptResult& result);
  void tick(AttemptResult& result);
  void kill_frozen();

  const RunOptions& options_;
  // What spawn_one() needs, kept for replacements (Note [A replacement is its rank]).
  comm::EnvMap env_;
  std::string program_;
  Assignment assignment_;
  int nproc_;
  AttemptContext context_;
  std::filesystem::path dir_;
  int signal_fd_;
  std::chrono::duration<double> stop_after_;
  std::filesystem::path report_path_;
  std::vector<Worker> workers_;
  OutputRouter router_;
  bool logs_ = true;  // the attempt's folder exists (Note [Logs never stop the job])
  bool stopping_ = false;
  int stop_signal_ = SIGTERM;
  Clock::time_point term_at_ = Clock::time_point::max();
  Clock::time_point kill_at_ = Clock::time_point::max();
  Clock::time_point next_tick_ = Clock::time_point::min();
  Clock::time_point last_frozen_check_ = Clock::now();
  std::function<bool()> tick_;
  FailureCallback on_failure_;
  std::function<std::optional<std::int64_t>()> finished_at_;
};

}  // namespace cohort::launcher
