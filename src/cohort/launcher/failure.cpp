#include "cohort/launcher/failure.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>

#include "cohort/launcher/worker_process.h"

namespace cohort::launcher {

bool WorkerOutcome::succeeded() const {
  return killed_after_the_end || (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0);
}

bool is_casualty(const WorkerOutcome& w) {
  // Killed by SIGPIPE: it wrote to a connection its peer had closed (a program that
  // set SIGPIPE back to its default; Note [SIGPIPE in workers]).
  if (WIFSIGNALED(w.wait_status) && WTERMSIG(w.wait_status) == SIGPIPE) return true;
  if (!w.error) return false;
  // Gloo's transport errors also reach a worker's error file unwrapped, when they
  // surface outside a collective cohort wraps (a pending operation, or teardown).
  const auto& m = w.error->message;
  for (const char* casualty : {"cohort::CommError", "cohort::TimeoutError", "gloo::IoException", "c10::DistNetworkError"})
    if (m.rfind(casualty, 0) == 0) return true;
  return false;
}

// Note [Root cause]
// When one worker dies, its peers fail too: their collectives see a closed
// connection (CommError, or Gloo's own IoException) or time out (TimeoutError). Exit order alone misleads,
// because a worker that throws tears down its sockets *before* its error handler
// writes the error file, so a peer can report the broken connection first. The
// root cause is therefore the first worker, in exit order, whose error is its own
// (anything but those two casualty errors), even if the launcher stopped it while it
// was exiting; failing that, the first that failed without being stopped and without
// a casualty's error (a worker killed by a signal leaves no error file); failing that,
// the first that failed at all.
const WorkerOutcome* root_cause(const std::vector<WorkerOutcome>& in_exit_order) {
  for (const auto& w : in_exit_order)
    if (!w.succeeded() && w.error && !is_casualty(w)) return &w;
  for (const auto& w : in_exit_order)
    if (!w.succeeded() && !w.stopped_by_launcher && !is_casualty(w)) return &w;
  for (const auto& w : in_exit_order)
    if (!w.succeeded() && !w.stopped_by_launcher) return &w;
  return nullptr;
}

std::string describe_outcome(const WorkerOutcome& w) {
  auto text = describe_status(w.wait_status);
  if (w.frozen) text += " (hung: it stayed stopped for --frozen-timeout, so the agent killed it)";
  return text;
}

std::string failure_summary(const std::vector<WorkerOutcome>& in_exit_order, const FailureContext& c) {
  std::string out = fmt::format("cohort run: the job failed (run id '{}', attempt {}, --max-restarts {})\n", c.run_id,
                                c.attempt, c.max_restarts);
  const WorkerOutcome* root = root_cause(in_exit_order);
  if (root) {
    out += fmt::format(
        "  root cause (first worker to fail):\n    rank {} (local rank {} on node {}, host {}), pid {}: {}\n",
        root->slot.rank, root->slot.local_rank, root->slot.group_rank, c.host, root->pid, describe_outcome(*root));
    if (root->error) {
      out += fmt::format("    message: {}\n", root->error->message);
      out += fmt::format("    error file: {}\n", root->error_file);
    } else {
      out += "    message: none left (the worker wrote no error file; wrap main in cohort::elastic::record, or read "
             "its output above)\n";
    }
  }
  for (const auto& w : in_exit_order) {
    if (&w == root || w.succeeded()) continue;
    out += fmt::format("  rank {} (pid {}): {}{}\n", w.slot.rank, w.pid, describe_outcome(w),
                       w.stopped_by_launcher ? ", stopped by the launcher" : "");
  }
  return out;
}

}  // namespace cohort::launcher
