#include "cohort/launcher/agent.h"

#include <fcntl.h>
#include <fmt/format.h>
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
#include "cohort/launcher/static_rendezvous.h"
#include "cohort/launcher/worker_group.h"

namespace cohort::launcher {
namespace fs = std::filesystem;

namespace {

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

std::string host_name() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
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
    WorkerGroup running(options, env, program, assignment, nproc, context,
                        base / ("attempt_" + std::to_string(attempt)), g_signal_pipe[0]);
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
