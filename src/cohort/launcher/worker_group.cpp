#include "cohort/launcher/worker_group.h"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "cohort/elastic/error_file.h"

namespace cohort::launcher {
namespace fs = std::filesystem;

namespace {

constexpr auto kSettle = std::chrono::milliseconds(1000);

// Whether `pid` is stopped by a signal (state T in /proc/PID/stat); a tracer's stop
// (t, a debugger) is not a hang.
bool is_stopped(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');  // the command name may itself hold ')' or spaces
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'T';
}

}  // namespace

WorkerGroup::WorkerGroup(const RunOptions& options, const comm::EnvMap& env, const std::string& program,
                         const Assignment& assignment, int nproc, const AttemptContext& context, const fs::path& dir,
                         int signal_fd)
    : options_(options),
      env_(env),
      program_(program),
      assignment_(assignment),
      nproc_(nproc),
      context_(context),
      dir_(dir),
      signal_fd_(signal_fd),
      stop_after_(options.stop_timeout),
      report_path_(dir / "report.txt") {
  try {
    make_log_dirs(dir, nproc);
    for (int local = 0; local < nproc; ++local) workers_.push_back(spawn_one(local, context_.first_incarnation));
  } catch (...) {
    kill_and_reap_all();  // a half-started job leaves nothing behind
    throw;
  }
}

WorkerGroup::~WorkerGroup() { kill_and_reap_all(); }

std::string WorkerGroup::report() const {
  if (!logs_) return {};
  std::ifstream in(report_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WorkerGroup::print_report() const {
  const auto text = report();
  if (!text.empty()) fmt::print(stderr, "cohort run: summary from the workers:\n{}", text);
}

// Note [Logs never stop the job]: a full or read-only log disk must not end the job
// at its next restart because the attempt's folder cannot be made. The attempt then
// runs without it: one warning, every worker's output on the console (--redirects
// included), no error files (the failure summary has the exit statuses) and no
// summary file from the workers.
void WorkerGroup::make_log_dirs(const fs::path& dir, int nproc) {
  std::error_code ec;
  fs::path failed = dir;
  fs::create_directories(dir, ec);
  for (int local = 0; !ec && local < nproc; ++local) {
    failed = dir / std::to_string(local);
    fs::create_directories(failed, ec);
  }
  if (!ec) {
    fs::remove(report_path_, ec);
    ec.clear();  // a stale report that cannot be removed is overwritten or ignored
    return;
  }
  logs_ = false;
  fmt::print(stderr,
             "cohort run: warning: cannot create the attempt's log folder {}: {}; this attempt runs with every "
             "worker's output on the console only (no log files, no error files)\n  fix: make room on the log "
             "folder's disk, or pass a --log-dir on a disk with space\n",
             failed.string(), ec.message());
}

// Note [A replacement is its rank]: incarnation k > 0 differs from the first only
// by COHORT_FT_INCARNATION and its folder, <local>_<k>.
WorkerGroup::Worker WorkerGroup::spawn_one(int local, int incarnation) {
  WorkerSlot slot{local, assignment_.base_rank + local, nproc_, assignment_.world_size, assignment_.group_rank,
                  assignment_.group_world_size};
  auto worker_dir = dir_ / (incarnation == 0 ? std::to_string(local) : fmt::format("{}_{}", local, incarnation));
  bool logs = logs_;
  if (logs && incarnation > 0) {
    std::error_code ec;
    fs::create_directories(worker_dir, ec);
    if (ec) {  // Note [Logs never stop the job], for this worker alone
      logs = false;
      fmt::print(stderr, "cohort run: warning: cannot create {}: {}; worker {}'s incarnation {} runs with its output "
                         "on the console only (no log files, no error file)\n",
                 worker_dir.string(), ec.message(), slot.rank, incarnation);
    }
  }
  auto error_file = logs ? (worker_dir / "error.json").string() : std::string();
  std::error_code ignored;
  if (logs) fs::remove(error_file, ignored);
  auto worker_env = worker_environment(env_, options_, slot, context_, error_file, incarnation);
  // Rank 0's straggler report and such, for the launcher's summary (trace/straggler.h).
  // An outer job's value must not leak in (Note [Variables the launcher owns]).
  if (logs) {
    worker_env["COHORT_REPORT_FILE"] = report_path_.string();
  } else {  // Note [Logs never stop the job]
    worker_env.erase("COHORT_REPORT_FILE");
    worker_env.erase("TORCHELASTIC_ERROR_FILE");
  }
  // The worker's stdout is a pipe; tell it when what it prints lands on a terminal
  // (Note [Progress lines]).
  const bool out_redirected = logs && options_.redirects.stdout_for(local);
  const bool err_redirected = logs && options_.redirects.stderr_for(local);
  if (console_is_tty(STDOUT_FILENO) && shown_on_console(out_redirected, slot))
    worker_env["COHORT_CONSOLE_TTY"] = "1";
  else
    worker_env.erase("COHORT_CONSOLE_TTY");
  auto proc = WorkerProcess::spawn({program_, options_.program_args, worker_env});
  Worker w{proc, {}, false};
  w.incarnation = incarnation;
  w.outcome.slot = slot;
  w.outcome.pid = proc.pid();
  w.outcome.error_file = error_file;
  route(proc.stdout_fd(), STDOUT_FILENO, out_redirected, logs && options_.tee.stdout_for(local),
        worker_dir / "stdout.log", slot);
  route(proc.stderr_fd(), STDERR_FILENO, err_redirected, logs && options_.tee.stderr_for(local),
        worker_dir / "stderr.log", slot);
  return w;
}

// Starts the next incarnation of `dead` in its place. A replacement that cannot start
// leaves the dead one there: the job then ends with exit code 1.
void WorkerGroup::replace(Worker& dead) {
  try {
    dead = spawn_one(dead.outcome.slot.local_rank, dead.incarnation + 1);
  } catch (const std::exception& e) {
    fmt::print(stderr, "cohort run: could not start the replacement of worker {}: {}; the others go on\n",
               dead.outcome.slot.rank, e.what());
  }
}

bool WorkerGroup::shown_on_console(bool redirected, const WorkerSlot& slot) const {
  return !redirected && (!options_.local_ranks_filter || options_.local_ranks_filter->count(slot.local_rank));
}

bool WorkerGroup::console_is_tty(int console) const {
  const auto& known = console == STDOUT_FILENO ? options_.stdout_is_tty : options_.stderr_is_tty;
  return known ? *known : ::isatty(console) == 1;
}

void WorkerGroup::route(int source, int console, bool redirected, bool teed, const fs::path& log,
                        const WorkerSlot& slot) {
  OutputRouter::Route r;
  r.source_fd = source;
  r.console_fd = shown_on_console(redirected, slot) ? console : -1;
  r.console_is_tty = console_is_tty(console);
  if (redirected || teed) r.log_path = log.string();  // the router creates it
  r.prefix = fmt::format("[rank{}]: ", slot.rank);
  router_.add(r);
}

AttemptResult WorkerGroup::monitor() {
  AttemptResult result;
  auto pipes_deadline = Clock::time_point::max();
  while (true) {
    bool all_exited = running() == 0;
    if (all_exited && router_.open_fds().empty()) break;
    auto now = Clock::now();
    if (all_exited && pipes_deadline == Clock::time_point::max())
      pipes_deadline = now + std::chrono::seconds(1);  // a grandchild may hold a pipe open
    if (now >= pipes_deadline) {
      router_.close_all();
      break;
    }
    if (stopping_ && now >= term_at_) send_stop();
    if (stopping_ && now >= kill_at_) kill_remaining();
    std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
    for (int fd : router_.open_fds()) fds.push_back({fd, POLLIN, 0});
    auto wake = std::min(stopping_ ? std::min(term_at_, kill_at_) : Clock::time_point::max(), pipes_deadline);
    // Exits and output wake poll at once; the interval only paces the deadlines.
    auto interval = std::chrono::duration<double>(std::max(options_.monitor_interval, 0.05));
    wake = std::min(wake, now + std::chrono::duration_cast<Clock::duration>(interval));
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
    int n = poll(fds.data(), fds.size(), static_cast<int>(std::max<long>(ms, 1)));
    if (n < 0 && errno != EINTR) throw Error(std::string("cohort run: poll: ") + std::strerror(errno));
    for (auto& p : fds) {
      if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      if (p.fd == signal_fd_)
        drain_signals(result);
      else
        router_.pump(p.fd);
    }
    reap(result);  // also catches exits whose SIGCHLD coalesced with another
    tick(result);
  }
  // The last incarnation of every worker: in-process mode replaces a dead worker
  // (Note [A replacement is its rank]); otherwise each worker has exactly one.
  result.success = result.received_signal == 0;
  for (const auto& w : workers_) result.success = result.success && w.outcome.succeeded();
  return result;
}

void WorkerGroup::tick(AttemptResult& result) {
  auto now = Clock::now();
  if (now < next_tick_ || running() == 0) return;
  next_tick_ = now + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::max(options_.monitor_interval, 0.05)));
  kill_frozen();
  if (!stopping_ && tick_ && tick_()) {
    result.interrupted = true;
    begin_stop(SIGTERM, false);
  }
}

// Note [Frozen workers]
// A worker stopped by SIGSTOP (or SIGTSTP) makes no progress and never exits; its
// peers would only notice when a collective times out (COHORT_TIMEOUT, minutes). The
// agent looks at each worker's state every tick, and one that has stayed stopped for
// --frozen-timeout is killed with SIGKILL (which works on a stopped process) and
// reported as hung; the usual failure path then restarts the job.
// Under --fault-tolerance in-process it is left alone: the workers' library drops it
// from the quorum and takes it back when it resumes. The agent says so once per stop.
void WorkerGroup::kill_frozen() {
  const bool keep = in_process_fault_tolerance(options_);
  auto now = Clock::now();
  auto limit = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.frozen_timeout));
  // A long gap between looks means the agent itself was suspended (a job
  // scheduler's suspend stops every process): start watching afresh.
  const auto gap = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(2 * std::max(options_.monitor_interval, 0.05) + 1.0));
  if (now - last_frozen_check_ > gap)
    for (auto& w : workers_) w.stopped_since = {};
  last_frozen_check_ = now;
  for (auto& w : workers_) {
    if (w.exited) continue;
    if (!is_stopped(w.outcome.pid)) {
      w.stopped_since = {};
      w.frozen_noted = false;
      continue;
    }
    if (w.stopped_since == Clock::time_point{}) w.stopped_since = now;
    if (keep) {
      // Note [A stopped worker after the end]
      if (now - w.stopped_since >= limit && finished_at_ && !w.outcome.killed_after_the_end) {
        if (const auto step = finished_at_()) {
          w.outcome.killed_after_the_end = true;
          fmt::print(stderr, "{}", stopped_after_the_end_line(w.outcome.slot.rank, w.incarnation, w.outcome.pid,
                                                              options_.frozen_timeout, *step));
          w.process.signal_group(SIGKILL);
          continue;
        }
      }
      if (now - w.stopped_since >= limit && !w.frozen_noted) {
        w.frozen_noted = true;
        fmt::print(stderr, "{}", frozen_note(w.outcome.slot.rank, w.incarnation, w.outcome.pid, options_.frozen_timeout));
      }
      continue;
    }
    if (now - w.stopped_since >= limit && !w.outcome.frozen) {
      w.outcome.frozen = true;
      w.process.signal_group(SIGKILL);
    }
  }
}

int WorkerGroup::running() const {
  return static_cast<int>(std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return !w.exited; }));
}

// After a worker failure the others get a short settle window, so that the worker at
// fault can finish writing its error file and exit on its own (Note [Root cause]);
// a signal to the launcher is forwarded at once.
void WorkerGroup::begin_stop(int sig, bool settle) {
  if (stopping_) return;
  stopping_ = true;
  stop_signal_ = sig;
  auto stop_after = std::chrono::duration_cast<Clock::duration>(stop_after_);
  auto now = Clock::now();
  term_at_ = settle ? now + std::min<Clock::duration>(kSettle, stop_after) : now;
  kill_at_ = term_at_ + stop_after;
  if (!settle) send_stop();
}

void WorkerGroup::send_stop() {
  term_at_ = Clock::time_point::max();
  for (auto& w : workers_) {
    if (w.exited) continue;
    w.outcome.stopped_by_launcher = true;
    w.process.signal_group(stop_signal_);
    w.process.signal_group(SIGCONT);  // a stopped worker acts on the signal only once resumed
  }
}

void WorkerGroup::kill_remaining() {
  for (auto& w : workers_)
    if (!w.exited) w.process.signal_group(SIGKILL);
  kill_at_ = Clock::time_point::max();
}

void WorkerGroup::kill_and_reap_all() {
  for (auto& w : workers_) {
    if (w.exited) continue;
    w.process.signal_group(SIGKILL);
    waitpid(w.outcome.pid, nullptr, 0);
    w.process.release_group();
    w.exited = true;
  }
}

void WorkerGroup::drain_signals(AttemptResult& result) {
  unsigned char sigs[64];
  ssize_t n;
  while ((n = read(signal_fd_, sigs, sizeof sigs)) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      int sig = sigs[i];
      if (sig == SIGCHLD) continue;
      if (result.received_signal) {
        kill_remaining();  // a second signal: no more patience
        continue;
      }
      result.received_signal = sig;
      if (stopping_) {
        stop_signal_ = sig;
        send_stop();  // cut a settle window short
      } else {
        begin_stop(sig, false);  // forward the signal itself, as torchrun does
      }
    }
  }
}

void WorkerGroup::reap(AttemptResult& result) {
  for (auto& w : workers_) {
    if (w.exited) continue;
    int status = 0;
    if (waitpid(w.outcome.pid, &status, WNOHANG) != w.outcome.pid) continue;
    w.exited = true;
    w.outcome.wait_status = status;
    w.outcome.exited_at_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
    w.process.signal_group(SIGKILL);  // whatever it left behind (Note [No orphans])
    w.process.release_group();
    // Exiting 0 while being stopped is a clean stop, not a casualty.
    if (w.outcome.succeeded()) w.outcome.stopped_by_launcher = false;
    w.outcome.error = elastic::read_error_file(w.outcome.error_file);
    result.in_exit_order.push_back(w.outcome);
    if (w.outcome.succeeded()) continue;
    const auto action = on_failure_ && !stopping_ ? on_failure_(w.outcome, w.incarnation) : FailureAction::kStopAll;
    if (action == FailureAction::kReplace)
      replace(w);  // at once: no settle window, no pacing, the others untouched
    else if (action == FailureAction::kStopAll)
      begin_stop(SIGTERM, true);
  }
}

}  // namespace cohort::launcher
