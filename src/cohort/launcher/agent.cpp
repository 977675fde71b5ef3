#include "cohort/launcher/agent.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <fmt/format.h>
#include <signal.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>

#include "cohort/launcher/agent_store.h"
#include "cohort/launcher/elastic_agent.h"
#include "cohort/launcher/failure.h"
#include "cohort/launcher/in_process.h"
#include "cohort/launcher/restart_pacing.h"
#include "cohort/launcher/signal_pipe.h"
#include "cohort/launcher/static_rendezvous.h"
#include "cohort/launcher/worker_env.h"
#include "cohort/launcher/worker_group.h"
#include "cohort/launcher/worker_process.h"
#include "cohort/util/host.h"
#include "cohort/util/parse.h"

namespace cohort::launcher {
namespace fs = std::filesystem;

namespace {

// Note [A lost static node's ranks are published dead]: a node whose agent has not
// beaten for this long is taken for lost. Its beat is every 0.5 s and the agent's
// monitor wakes every --monitor-interval, so only a lost (or frozen) agent is this
// late; a job's first quorum waits this long for it instead of 5 minutes.
constexpr std::chrono::milliseconds kStaticNodeLostAfter{10000};

// Signals reach the agent through a self-pipe, so the worker group's poll loop sees
// them in order with worker output and exits (Note [No orphans] covers the workers'
// side). A signal handler can reach nothing but a global, so this one pipe is the
// process's only global state; everything else receives its read end.
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

// Note [Restart pacing]: the pause before restarting a group that ran for
// `ran_for`; returns a signal that cut it short, or 0.
int pause_before_restart(RestartPacing& pacing, std::chrono::steady_clock::duration ran_for, int signal_fd) {
  const auto pause = pacing.after_failure(std::chrono::duration_cast<std::chrono::milliseconds>(ran_for));
  fmt::print(stderr, "{}", pacing.explain(pause));
  return wait_for_signal(signal_fd, pause);
}

std::string random_id() {
  std::random_device rd;
  return fmt::format("{:08x}", rd());
}

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

// Note [The run directory]: the folder of per-attempt error files and logs, under
// --log-dir when given (kept), else a temporary one removed however the run ends.
// Only its owner may enter it (0700, as torchrun's mkdtemp): worker logs and error
// files hold whatever the program prints. It is made once the static rendezvous is
// over, so that a SIGINT during the rendezvous (which still ends the launcher by the
// default action) leaves no folder behind; check_log_dir() reports a bad --log-dir
// before anything starts.
void RunDirectory::check_log_dir(const RunOptions& options) {
  if (options.log_dir.empty()) return;
  std::error_code ec;
  fs::create_directories(options.log_dir, ec);
  if (!ec && ::access(options.log_dir.c_str(), W_OK | X_OK) != 0) ec = std::error_code(errno, std::generic_category());
  if (ec)
    throw UsageError(fmt::format("--log-dir {}: cannot create or write it: {}; give a writable directory",
                                 options.log_dir, ec.message()));
}

RunDirectory::RunDirectory(const RunOptions& options, const std::string& run_id)
    : keep_(!options.log_dir.empty() || options.redirects.any() || options.tee.any()) {
  std::error_code ec;
  if (!options.log_dir.empty()) {
    fs::create_directories(options.log_dir, ec);
    path_ = fs::path(options.log_dir) / (run_id + "_" + random_id());
  } else {
    path_ = fs::temp_directory_path() / ("cohort-run-" + run_id + "-" + random_id());
  }
  // Workers may change directory before they write TORCHELASTIC_ERROR_FILE, and the
  // launcher's messages name the folder: both need the absolute path.
  if (!ec) path_ = fs::absolute(path_, ec);
  if (!ec && ::mkdir(path_.c_str(), 0700) != 0) ec = std::error_code(errno, std::generic_category());
  if (ec)
    throw UsageError(fmt::format("--log-dir {}: cannot create {}: {}; give a writable directory",
                                 options.log_dir.empty() ? fs::temp_directory_path().string() : options.log_dir,
                                 path_.string(), ec.message()));
  if (keep_) fmt::print(stderr, "cohort run: worker logs and error files in {}\n", path_.string());
}

RunDirectory::~RunDirectory() {
  std::error_code ignored;
  if (!keep_) fs::remove_all(path_, ignored);
}

// Note [A job that ends on a configuration error]
// A job whose root cause (failure.h) is a worker that stopped on a
// cohort::ConfigError, as its error file says (a flag the program refuses, ranks
// started with different settings), ends with exit code 2, the launcher's own code
// for input the job cannot run with, and not 1. The static agent does not restart
// it: every worker would get the same environment and stop on the same error
// (Note [A restart that cannot help] in launcher/in_process.h, where in-process mode
// replaces no such worker). A program that does not record its errors
// (cohort::elastic::record) leaves no error file, and its failures stay 1.
int run_agent(const RunOptions& options, const comm::EnvMap& env, const HostResources& resources) {
  raise_open_files_limit();  // Note [Open files limit] in launcher/worker_process.h
  start_orphan_reaper();     // Note [No orphans] in launcher/worker_process.h
  struct ReaperStop {
    ~ReaperStop() { stop_orphan_reaper(); }
  } reaper_stop;  // on every way out, errors included
  // Everything that can be wrong with the input is checked before anything starts.
  const int nproc = resolve_nproc(options.nproc_per_node, resources.cpu_count, resources.gpu_count);
  check_min_replicas(options, nproc * options.max_nodes);
  auto path = env.count("PATH") ? env.at("PATH") : std::string("/usr/bin:/bin");
  const std::string program = resolve_program(options.program, path);
  std::string run_id = options.run_id;
  if (options.standalone && run_id == "none") run_id = random_id();
  RunDirectory::check_log_dir(options);
  if (is_elastic(options)) {
    install_signal_handlers();
    RunDirectory dir(options, run_id);
    AgentSetup setup{options, env, program, nproc, run_id, [&](int n) { return dir.attempt(n); }, g_signal_pipe[0]};
    return run_elastic_agent(setup);
  }
  const auto timeout = util::timeout_from_seconds(options.join_timeout, "--join-timeout");

  // Note [Telling a stock worker from a port scan]
  const auto watch = std::make_shared<StockWorkerWatch>(::getpid());
  StaticRendezvous rendezvous(options, timeout, resolve_certificates(env), watch);
  const Assignment assignment = rendezvous.assign(nproc);

  install_signal_handlers();
  RunDirectory dir(options, run_id);  // Note [The run directory]
  // Note [Variables the launcher owns]: none of an outer job's store may leak in.
  const comm::EnvMap worker_base = without_launcher_variables(env);
  // Workers reach the store the way node 0's agent reaches it: loopback when one node.
  AttemptContext context{options.max_nodes == 1 ? std::string("127.0.0.1") : options.master_addr, rendezvous.port(), 0,
                         run_id};
  int exit_code = 1;
  RestartPacing pacing(restart_pacing_for(options.monitor_interval));
  // --fault-tolerance in-process: one attempt, whose dead workers are replaced alone
  // (launcher/in_process.h); --max-restarts counts those replacements.
  std::optional<InProcessRestarts> in_process;
  // Publishing a death must not keep the agent from the survivors for long: the store
  // is this agent's own, so 10 s is plenty (or --join-timeout, when shorter).
  if (in_process_fault_tolerance(options)) {
    in_process.emplace(rendezvous.workers_view(0, std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(10))),
                       options.max_restarts);
    context.first_incarnation = in_process->first_incarnation(options.node_rank);
  }
  // Note [A lost static node's ranks are published dead]
  std::optional<StaticNodeBeats> beats;
  if (in_process && options.max_nodes > 1)
    beats.emplace(rendezvous.workers_view(0, std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(10))),
                  rendezvous.node_sizes(), options.node_rank, kStaticNodeLostAfter);
  for (int attempt = 0;; ++attempt) {
    context.restart_count = attempt;
    const auto started = std::chrono::steady_clock::now();
    comm::EnvMap attempt_env = worker_base;
    for (auto& [name, value] : rendezvous.worker_variables(attempt)) attempt_env[name] = value;
    WorkerGroup running(options, attempt_env, program, assignment, nproc, context, dir.attempt(attempt),
                        g_signal_pipe[0]);
    if (in_process) {
      running.on_worker_failure(
          [&](const WorkerOutcome& dead, int incarnation) { return in_process->on_death(dead, incarnation); });
      running.on_training_finished([&] { return in_process->finished_at(); });
    }
    running.on_tick([&] {
      if (beats) beats->tick(*in_process);
      return watch->sighting().has_value();
    });
    auto result = running.monitor();
    if (beats) beats->done();
    running.print_report();
    const auto ran_for = std::chrono::steady_clock::now() - started;
    if (result.success && !result.interrupted) {
      exit_code = 0;
      break;
    }
    if (result.received_signal) {
      fmt::print(stderr, "cohort run: stopped by signal {}; every worker has exited\n",
                 sigabbrev_np(result.received_signal) ? sigabbrev_np(result.received_signal) : "?");
      return 128 + result.received_signal;  // nothing to wait for: the user wants out
    }
    if (const auto seen = watch->sighting()) {
      fmt::print(stderr, "cohort run: error: {}\n", *seen);
      return 2;  // as for any input the job cannot run with: no restart mends it
    }
    FailureContext fc{util::host_name(), run_id, attempt, options.max_restarts};
    fmt::print(stderr, "{}", failure_summary(result.in_exit_order, fc));
    // Note [A job that ends on a configuration error]
    const WorkerOutcome* cause = root_cause(result.in_exit_order);
    const bool refused = cause && repeats_in_a_replacement(*cause);
    if (in_process) {
      fmt::print(stderr, "{}", in_process->summary(result.in_exit_order));
      exit_code = refused ? 2 : 1;
      break;
    }
    if (refused) {
      if (attempt < options.max_restarts)
        fmt::print(stderr, "cohort run: not restarting: worker {} stopped on a configuration error, which a restart "
                           "with the same environment would repeat (no restart used); fix it and run the job again\n",
                   cause->slot.rank);
      exit_code = 2;
      break;
    }
    if (attempt >= options.max_restarts) {
      exit_code = 1;
      break;
    }
    fmt::print(stderr, "cohort run: restarting every worker (restart {} of {})\n", attempt + 1, options.max_restarts);
    if (int sig = pause_before_restart(pacing, ran_for, g_signal_pipe[0])) {
      fmt::print(stderr, "cohort run: stopped by signal {} before the restart; every worker has exited\n",
                 sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
      return 128 + sig;
    }
  }
  if (int sig = rendezvous.finish(g_signal_pipe[0])) {
    fmt::print(stderr, "cohort run: stopped by signal {} while waiting for the other nodes to finish\n",
               sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
    return 128 + sig;
  }
  return exit_code;
}

}  // namespace cohort::launcher
