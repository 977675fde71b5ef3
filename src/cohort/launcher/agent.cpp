#include "cohort/launcher/agent.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "cohort/elastic/error_file.h"
#include "cohort/launcher/failure.h"
#include "cohort/launcher/output_router.h"
#include "cohort/launcher/static_rendezvous.h"
#include "cohort/launcher/worker_process.h"

namespace cohort::launcher {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Signals reach the agent through a self-pipe, so the poll loop sees them in order
// with worker output and exits (Note [No orphans] covers the workers' side).
int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  ssize_t ignored = write(g_signal_pipe[1], &byte, 1);
  (void)ignored;
  errno = saved;
}

void install_signal_handlers() {
  if (g_signal_pipe[0] < 0 && pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(std::string("cohort run: pipe: ") + std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaction(s, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

std::string host_name() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

std::string random_id() {
  std::random_device rd;
  return fmt::format("{:08x}", rd());
}

int open_log(const fs::path& path) {
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
}

struct Worker {
  WorkerProcess process;
  WorkerOutcome outcome;
  bool exited = false;
};

struct AttemptResult {
  bool success = false;
  int received_signal = 0;
  std::vector<WorkerOutcome> in_exit_order;
};

class Attempt {
 public:
  Attempt(const RunOptions& options, const comm::EnvMap& env, const std::string& program, const Assignment& assignment,
          int nproc, const AttemptContext& context, const fs::path& dir)
      : options_(options), stop_after_(std::chrono::duration<double>(options.stop_timeout)) {
    try {
      spawn_all(env, program, assignment, nproc, context, dir);
    } catch (...) {
      kill_and_reap_all();  // a half-started job leaves nothing behind
      throw;
    }
  }

  ~Attempt() { kill_and_reap_all(); }
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;

 private:
  void spawn_all(const comm::EnvMap& env, const std::string& program, const Assignment& assignment, int nproc,
                 const AttemptContext& context, const fs::path& dir) {
    const RunOptions& options = options_;
    for (int local = 0; local < nproc; ++local) {
      WorkerSlot slot{local, assignment.base_rank + local, nproc, assignment.world_size, assignment.group_rank,
                      assignment.group_world_size};
      auto worker_dir = dir / std::to_string(local);
      fs::create_directories(worker_dir);
      auto error_file = (worker_dir / "error.json").string();
      fs::remove(error_file);
      auto proc = WorkerProcess::spawn({program, options.program_args,
                                        worker_environment(env, options, slot, context, error_file)});
      Worker w{proc, {}, false};
      w.outcome.slot = slot;
      w.outcome.pid = proc.pid();
      w.outcome.error_file = error_file;
      workers_.push_back(w);
      route(proc.stdout_fd(), STDOUT_FILENO, options.redirects.stdout_for(local), options.tee.stdout_for(local),
            worker_dir / "stdout.log", slot);
      route(proc.stderr_fd(), STDERR_FILENO, options.redirects.stderr_for(local), options.tee.stderr_for(local),
            worker_dir / "stderr.log", slot);
    }
  }

  void kill_and_reap_all() {
    for (auto& w : workers_) {
      if (w.exited) continue;
      w.process.signal_group(SIGKILL);
      waitpid(w.outcome.pid, nullptr, 0);
      w.exited = true;
    }
  }

 public:
  AttemptResult monitor() {
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
      std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
      for (int fd : router_.open_fds()) fds.push_back({fd, POLLIN, 0});
      auto wake = std::min({stopping_ ? std::min(term_at_, kill_at_) : Clock::time_point::max(), pipes_deadline});
      auto interval = std::chrono::duration<double>(options_.monitor_interval);
      wake = std::min(wake, now + std::chrono::duration_cast<Clock::duration>(interval));
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
      int n = poll(fds.data(), fds.size(), static_cast<int>(std::max<long>(ms, 1)));
      if (n < 0 && errno != EINTR) throw Error(std::string("cohort run: poll: ") + std::strerror(errno));
      for (auto& p : fds) {
        if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
        if (p.fd == g_signal_pipe[0])
          drain_signals(result);
        else
          router_.pump(p.fd);
      }
      reap(result);  // also catches exits whose SIGCHLD coalesced with another
    }
    result.success = result.received_signal == 0;
    for (const auto& o : result.in_exit_order) result.success = result.success && o.succeeded();
    return result;
  }

 private:
  void route(int source, int console, bool redirected, bool teed, const fs::path& log, const WorkerSlot& slot) {
    OutputRouter::Route r;
    r.source_fd = source;
    bool shown = !redirected && (!options_.local_ranks_filter || options_.local_ranks_filter->count(slot.local_rank));
    r.console_fd = shown ? console : -1;
    r.log_fd = (redirected || teed) ? open_log(log) : -1;
    r.prefix = fmt::format("[rank{}]: ", slot.rank);
    router_.add(r);
  }

  int running() const {
    int n = 0;
    for (const auto& w : workers_) n += !w.exited;
    return n;
  }

  // Stops every running worker with `sig`. After a worker failure the others get a
  // short settle window first, so that the worker at fault can finish writing its
  // error file and exit on its own (Note [Root cause]); a signal to the launcher is
  // forwarded at once.
  void begin_stop(int sig, bool settle) {
    if (stopping_) return;
    stopping_ = true;
    stop_signal_ = sig;
    auto now = Clock::now();
    term_at_ = settle ? now + std::min<Clock::duration>(kSettle, std::chrono::duration_cast<Clock::duration>(stop_after_))
                      : now;
    kill_at_ = term_at_ + std::chrono::duration_cast<Clock::duration>(stop_after_);
    if (!settle) send_stop();
  }

  void send_stop() {
    term_at_ = Clock::time_point::max();
    for (auto& w : workers_) {
      if (w.exited) continue;
      w.outcome.stopped_by_launcher = true;
      w.process.signal_group(stop_signal_);
    }
  }

  void kill_remaining() {
    for (auto& w : workers_)
      if (!w.exited) w.process.signal_group(SIGKILL);
    kill_at_ = Clock::time_point::max();
  }

  void drain_signals(AttemptResult& result) {
    unsigned char sigs[64];
    ssize_t n;
    while ((n = read(g_signal_pipe[0], sigs, sizeof sigs)) > 0) {
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

  void reap(AttemptResult& result) {
    for (auto& w : workers_) {
      if (w.exited) continue;
      int status = 0;
      pid_t pid = waitpid(w.outcome.pid, &status, WNOHANG);
      if (pid != w.outcome.pid) continue;
      w.exited = true;
      w.outcome.wait_status = status;
      // Exiting 0 while being stopped is a clean stop, not a casualty.
      if (w.outcome.succeeded()) w.outcome.stopped_by_launcher = false;
      w.outcome.error = elastic::read_error_file(w.outcome.error_file);
      result.in_exit_order.push_back(w.outcome);
      if (!w.outcome.succeeded()) begin_stop(SIGTERM, true);
    }
  }

  const RunOptions& options_;
  std::chrono::duration<double> stop_after_;
  std::vector<Worker> workers_;
  OutputRouter router_;
  static constexpr auto kSettle = std::chrono::milliseconds(500);
  bool stopping_ = false;
  int stop_signal_ = SIGTERM;
  Clock::time_point term_at_ = Clock::time_point::max();
  Clock::time_point kill_at_ = Clock::time_point::max();
};

}  // namespace

HostResources detect_resources() {
  HostResources r;
  cpu_set_t set;
  CPU_ZERO(&set);
  r.cpu_count = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                             : static_cast<int>(std::thread::hardware_concurrency());
  r.gpu_count = static_cast<int>(torch::cuda::device_count());
  return r;
}

int run_agent(const RunOptions& options, const comm::EnvMap& env, const HostResources& resources) {
  const int nproc = resolve_nproc(options.nproc_per_node, resources.cpu_count, resources.gpu_count);
  auto path = env.count("PATH") ? env.at("PATH") : std::string("/usr/bin:/bin");
  const std::string program = resolve_program(options.program, path);
  const auto timeout = std::chrono::milliseconds(static_cast<long>(options.join_timeout * 1000));

  StaticRendezvous rendezvous(options, timeout);
  const Assignment assignment = rendezvous.assign(nproc);
  std::string run_id = options.run_id;
  if (options.standalone && run_id == "none") run_id = random_id();

  // Per-attempt folders hold error files and, with --redirects/--tee, the logs.
  // Without --log-dir they live in a temporary folder removed at the end.
  bool keep_dir = !options.log_dir.empty();
  fs::path base;
  if (keep_dir) {
    fs::create_directories(options.log_dir);
    base = fs::path(options.log_dir) / (run_id + "_" + random_id());
  } else {
    base = fs::temp_directory_path() / ("cohort-run-" + run_id + "-" + random_id());
  }
  fs::create_directories(base);
  if (keep_dir || options.redirects.any() || options.tee.any())
    fmt::print(stderr, "cohort run: worker logs and error files in {}\n", base.string());
  keep_dir = keep_dir || options.redirects.any() || options.tee.any();

  install_signal_handlers();
  // Workers reach the store the way node 0's agent reaches it: loopback when one node.
  AttemptContext context{options.max_nodes == 1 ? std::string("127.0.0.1") : options.master_addr, rendezvous.port(), 0,
                         run_id};
  int exit_code = 1;
  for (int attempt = 0;; ++attempt) {
    context.restart_count = attempt;
    Attempt running(options, env, program, assignment, nproc, context, base / ("attempt_" + std::to_string(attempt)));
    auto result = running.monitor();
    if (result.success) {
      exit_code = 0;
      break;
    }
    if (result.received_signal) {
      fmt::print(stderr, "cohort run: stopped by signal {}; every worker has exited\n",
                 sigabbrev_np(result.received_signal) ? sigabbrev_np(result.received_signal) : "?");
      exit_code = 128 + result.received_signal;
      break;
    }
    FailureContext fc{host_name(), run_id, attempt, options.max_restarts};
    fmt::print(stderr, "{}", failure_summary(result.in_exit_order, fc));
    if (attempt >= options.max_restarts) {
      exit_code = 1;
      break;
    }
    fmt::print(stderr, "cohort run: restarting every worker (restart {} of {})\n", attempt + 1, options.max_restarts);
  }
  rendezvous.finish();
  if (!keep_dir) {
    std::error_code ignored;
    fs::remove_all(base, ignored);
  }
  return exit_code;
}

}  // namespace cohort::launcher
