// The launcher's pure pieces: worker environment, line splitting, rank assignment,
// failure summaries.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cohort/launcher/agent.h"
#include "cohort/launcher/failure.h"
#include "cohort/launcher/line_splitter.h"
#include "cohort/launcher/output_router.h"
#include "cohort/launcher/signal_pipe.h"
#include "cohort/launcher/static_rendezvous.h"
#include "cohort/launcher/worker_env.h"
#include "cohort/launcher/worker_group.h"
#include "support/subprocess.h"
#include "cohort/launcher/worker_process.h"

namespace {
using namespace cohort::launcher;

TEST(WorkerEnv, SetsTheTorchrunContract) {
  RunOptions o;
  o.max_restarts = 2;
  WorkerSlot slot{1, 5, 4, 8, 1, 2};
  AttemptContext ctx{"10.1.2.3", 29400, 1, "job"};
  auto env = worker_environment({{"PATH", "/bin"}}, o, slot, ctx, "/tmp/e.json");
  EXPECT_EQ(env["PATH"], "/bin");
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["RANK"], "5");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["ROLE_RANK"], "5");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["WORLD_SIZE"], "8");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(env["MASTER_ADDR"], "10.1.2.3");
  EXPECT_EQ(env["MASTER_PORT"], "29400");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "1");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "2");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job");
  EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "True");
  EXPECT_EQ(env["TORCHELASTIC_ERROR_FILE"], "/tmp/e.json");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
}

// An elastic job's limit is the one in its rendezvous record, not the agent's flag.
TEST(WorkerEnv, TheJobsRestartLimitOutranksTheAgentsFlag) {
  RunOptions o;
  o.max_restarts = 5;
  WorkerSlot slot{0, 0, 1, 1, 0, 1};
  AttemptContext ctx{"127.0.0.1", 29400, 0, "job"};
  ctx.max_restarts = 1;
  EXPECT_EQ(worker_environment({}, o, slot, ctx, "/tmp/e.json")["TORCHELASTIC_MAX_RESTARTS"], "1");
}

// Note [Threads per worker]
TEST(WorkerEnv, ThreadPoolsOneThreadEachForSeveralWorkersEveryCoreForOne) {
  RunOptions o;
  WorkerSlot many{0, 0, 2, 2, 0, 1};
  auto env = worker_environment({}, o, many, {}, "e");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(env["OPENBLAS_NUM_THREADS"], "1");
  env = worker_environment({{"OMP_NUM_THREADS", "4"}}, o, many, {}, "e");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "4");
  EXPECT_EQ(env["OPENBLAS_NUM_THREADS"], "4");  // OpenBLAS follows the user's choice
  env = worker_environment({{"OPENBLAS_NUM_THREADS", "3"}}, o, many, {}, "e");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(env["OPENBLAS_NUM_THREADS"], "3");

  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  const std::string cores = std::to_string(CPU_COUNT(&set));
  WorkerSlot one{0, 0, 1, 1, 0, 1};
  env = worker_environment({}, o, one, {}, "e");
  EXPECT_EQ(env["OMP_NUM_THREADS"], cores);
  EXPECT_EQ(env["OPENBLAS_NUM_THREADS"], cores);
  EXPECT_EQ(worker_environment({{"OMP_NUM_THREADS", "1"}}, o, one, {}, "e")["OPENBLAS_NUM_THREADS"], "1");
}

TEST(WorkerEnv, NcclAsyncErrorHandlingUnderBothNames) {
  RunOptions o;
  WorkerSlot slot{0, 0, 1, 1, 0, 1};
  auto both = worker_environment({}, o, slot, {}, "e");
  EXPECT_EQ(both["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");  // LibTorch 2.x
  EXPECT_EQ(both["NCCL_ASYNC_ERROR_HANDLING"], "1");        // LibTorch 1.13
  // A user's choice under either name holds under both.
  auto old_name = worker_environment({{"NCCL_ASYNC_ERROR_HANDLING", "0"}}, o, slot, {}, "e");
  EXPECT_EQ(old_name["NCCL_ASYNC_ERROR_HANDLING"], "0");
  EXPECT_EQ(old_name["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "0");
  auto new_name = worker_environment({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}}, o, slot, {}, "e");
  EXPECT_EQ(new_name["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "3");
  EXPECT_EQ(new_name["NCCL_ASYNC_ERROR_HANDLING"], "3");
  auto mixed = worker_environment({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "2"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"}}, o,
                                  slot, {}, "e");
  EXPECT_EQ(mixed["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "2");
  EXPECT_EQ(mixed["NCCL_ASYNC_ERROR_HANDLING"], "0");
}

TEST(WorkerEnv, LauncherOwnedVariablesAreCleared) {
  const cohort::comm::EnvMap outer{{"COHORT_AGENT_STORE", "cohort"},
                                   {"COHORT_STORE_PREFIX", "/cohort/outer/round_0/worker"},
                                   {"COHORT_RDZV_TOKEN", "outer-job-token-0123456789"},
                                   {"COHORT_CONSOLE_TTY", "1"},
                                   {"PET_RDZV_TOKEN", "outer-job-token-0123456789"},
                                   {"PET_NNODES", "2"},
                                   {"PATH", "/bin"}};
  auto base = without_launcher_variables(outer);
  EXPECT_EQ(base, (cohort::comm::EnvMap{{"PATH", "/bin"}, {"PET_NNODES", "2"}}));
}

// What a worker prints on stdout (bounded: the worker exits at once).
std::string worker_stdout(const SpawnRequest& request) {
  auto w = WorkerProcess::spawn(request);
  std::string out;
  char buf[256];
  for (ssize_t n; (n = ::read(w.stdout_fd(), buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(w.stdout_fd());
  ::close(w.stderr_fd());
  ::waitpid(w.pid(), nullptr, 0);
  return out;
}

// Note [Open files limit]: the launcher runs at the hard limit, its workers at the
// soft limit it was started with.
TEST(OpenFilesLimit, TheLauncherTakesTheHardLimitAndWorkersKeepTheirs) {
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max <= 256) GTEST_SKIP() << "hard limit too low to lower under";
  rlimit low = saved;
  low.rlim_cur = 256;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  const rlim_t now = raise_open_files_limit();
  rlimit raised{};
  ::getrlimit(RLIMIT_NOFILE, &raised);
  const auto in_worker = worker_stdout({"/bin/sh", {"-c", "ulimit -n"}, {{"PATH", "/bin:/usr/bin"}}});
  ::setrlimit(RLIMIT_NOFILE, &saved);
  EXPECT_EQ(raised.rlim_cur, raised.rlim_max);
  EXPECT_EQ(now, raised.rlim_max);
  EXPECT_EQ(in_worker, "256\n");
}

std::filesystem::path make_temp_dir() {
  char tmpl[] = "/tmp/cohort-pieces-XXXXXX";
  return ::mkdtemp(tmpl);
}

// Note [The run directory]: 0700, as torchrun's, with --log-dir or without.
TEST(RunDirectory, OnlyItsOwnerMayEnterIt) {
  const auto base = make_temp_dir();
  RunOptions kept;
  kept.log_dir = (base / "logs").string();
  std::filesystem::path temp_path;
  {
    RunDirectory logged(kept, "job");
    RunDirectory temporary(RunOptions{}, "job");
    temp_path = temporary.path();
    for (const auto* d : {&logged, &temporary}) {
      struct stat st {};
      ASSERT_EQ(::stat(d->path().c_str(), &st), 0) << d->path();
      EXPECT_EQ(st.st_mode & 0777, 0700u) << d->path();
    }
  }
  EXPECT_FALSE(std::filesystem::exists(temp_path)) << "the temporary one is removed";
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(base / "logs"), {}), 1) << "the --log-dir one is kept";
  std::ofstream(base / "file") << "x";
  RunOptions bad;
  bad.log_dir = (base / "file" / "logs").string();
  EXPECT_THROW(RunDirectory::check_log_dir(bad), UsageError);
  std::filesystem::remove_all(base);
}

// Note [Logs never stop the job]: an attempt whose log folder cannot be made (a full
// disk; here a file where a folder should be) runs with the console only, even under
// --redirects 3, and says so.
TEST(WorkerGroup, AnAttemptWhoseLogFolderCannotBeMadeRunsWithTheConsoleOnly) {
  const auto base = make_temp_dir();
  std::ofstream(base / "blocker") << "x";
  RunOptions o;
  o.redirects = parse_stream_selection("3", "--redirects");
  o.stdout_is_tty = o.stderr_is_tty = false;
  o.program_args = {"-c", "echo hello; echo oops >&2; test -z \"$TORCHELASTIC_ERROR_FILE$COHORT_REPORT_FILE\""};
  int signals[2];
  ASSERT_EQ(::pipe2(signals, O_NONBLOCK | O_CLOEXEC), 0);
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  AttemptResult result;
  try {
    WorkerGroup group(o, {{"PATH", "/bin:/usr/bin"}}, "/bin/sh", Assignment{}, 1,
                      AttemptContext{"127.0.0.1", 1, 1, "job", {}}, base / "blocker" / "attempt_1", signals[0]);
    result = group.monitor();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "the attempt did not run: " << e.what();
  }
  const auto out = testing::internal::GetCapturedStdout();
  const auto err = testing::internal::GetCapturedStderr();
  ::close(signals[0]);
  ::close(signals[1]);
  std::filesystem::remove_all(base);
  EXPECT_TRUE(result.success) << err;
  EXPECT_NE(out.find("[rank0]: hello"), std::string::npos) << out;
  EXPECT_NE(err.find("[rank0]: oops"), std::string::npos) << err;
  EXPECT_NE(err.find("warning: cannot create the attempt's log folder"), std::string::npos) << err;
}

// Note [No orphans]: an agent killed by kill -9 takes its workers' children with it
// (a wrapper script's trainer), through the reaper. PDEATHSIG alone kills only the
// worker itself; its `sleep` lived on.
TEST(NoOrphans, AWorkersChildDiesWithAnAgentKilledByKill9) {
  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  const pid_t agent = ::fork();
  ASSERT_GE(agent, 0);
  if (agent == 0) {  // the agent: the reaper, then a worker that is a wrapper script
    ::close(report[0]);
    start_orphan_reaper();
    auto w = WorkerProcess::spawn({"/bin/sh", {"-c", "sleep 60 & echo $!; wait"}, {{"PATH", "/bin:/usr/bin"}}});
    char buf[64];
    const ssize_t n = ::read(w.stdout_fd(), buf, sizeof buf);
    if (n > 0 && ::write(report[1], buf, static_cast<std::size_t>(n)) != n) ::_exit(1);
    ::pause();
    ::_exit(0);
  }
  ::close(report[1]);
  std::string line;
  pollfd p{report[0], POLLIN, 0};
  char buf[64];
  ssize_t n = 0;
  if (::poll(&p, 1, 10'000) == 1) n = ::read(report[0], buf, sizeof buf);
  ::close(report[0]);
  if (n > 0) line.assign(buf, static_cast<std::size_t>(n));
  ::kill(agent, SIGKILL);
  ::waitpid(agent, nullptr, 0);
  ASSERT_FALSE(line.empty()) << "the worker did not report its child";
  const pid_t trainer = static_cast<pid_t>(std::stol(line));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (!cohort::testing::process_gone(trainer) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const bool gone = cohort::testing::process_gone(trainer);
  if (!gone) ::kill(trainer, SIGKILL);
  EXPECT_TRUE(gone) << "the worker's child outlived the agent";
}

// The processes of process group `group` other than `self` (from /proc).
int others_in_group(pid_t group, pid_t self) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos || std::stol(name) == self) continue;
    std::ifstream in(entry.path() / "stat");
    std::string stat;
    if (!std::getline(in, stat)) continue;
    const auto name_end = stat.rfind(')');  // the name may hold spaces and parentheses
    if (name_end == std::string::npos) continue;
    std::istringstream rest(stat.substr(name_end + 2));
    char state;
    long parent, pgrp;
    if (rest >> state >> parent >> pgrp && pgrp == group && state != 'Z') ++count;
  }
  return count;
}

// Note [No orphans]: the reaper lives as long as the launcher, and no longer: once
// `cohort run` returns, no process of the job is left (CI's network-namespace test
// found the reaper still there the moment its agent had exited).
TEST(NoOrphans, TheReaperIsGoneWhenTheLauncherStopsIt) {
  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  const pid_t agent = ::fork();
  ASSERT_GE(agent, 0);
  if (agent == 0) {  // the agent, leading its own group, which its reaper joins
    ::close(report[0]);
    ::setpgid(0, 0);
    start_orphan_reaper();
    const int counts[2] = {others_in_group(::getpid(), ::getpid()), (stop_orphan_reaper(), others_in_group(::getpid(), ::getpid()))};
    ::_exit(::write(report[1], counts, sizeof counts) == sizeof counts ? 0 : 1);
  }
  ::close(report[1]);
  int counts[2] = {-1, -1};
  pollfd p{report[0], POLLIN, 0};
  if (::poll(&p, 1, 10'000) == 1 && ::read(report[0], counts, sizeof counts) != sizeof counts) counts[0] = -1;
  ::close(report[0]);
  int status = 0;
  ::waitpid(agent, &status, 0);
  EXPECT_EQ(counts[0], 1) << "the reaper did not start";
  EXPECT_EQ(counts[1], 0) << "the reaper outlived stop_orphan_reaper()";
  ::kill(-agent, SIGKILL);  // nothing should be left; in case something is
}

TEST(SignalPipe, ChildExitsAreNotStopRequests) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_NONBLOCK), 0);
  const unsigned char exits[] = {SIGCHLD, SIGCHLD};
  ASSERT_EQ(::write(fds[1], exits, sizeof exits), 2);
  EXPECT_EQ(pending_signal(fds[0]), 0);
  const unsigned char mixed[] = {SIGCHLD, SIGTERM, SIGCHLD, SIGINT};
  ASSERT_EQ(::write(fds[1], mixed, sizeof mixed), 4);
  EXPECT_EQ(pending_signal(fds[0]), SIGTERM);
  EXPECT_EQ(pending_signal(fds[0]), 0) << "every byte is drained";
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST(LineSplitter, JoinsChunksAndFlushesTheTail) {
  LineSplitter s;
  std::vector<std::string> lines;
  auto emit = [&](const std::string& l) { lines.push_back(l); };
  s.feed("hel", 3, emit);
  s.feed("lo\nwor", 6, emit);
  s.feed("ld\n\nend", 7, emit);
  EXPECT_EQ(lines, (std::vector<std::string>{"hello", "world", ""}));
  s.finish(emit);
  EXPECT_EQ(lines.back(), "end");
}

TEST(LineSplitter, CarriageReturnsEndStatusSegmentsOnlyWhenAsked) {
  LineSplitter s;
  std::vector<std::string> lines, status;
  const std::string text = "\rstep 1\rstep 2\nsummary\n";
  s.feed(text.data(), text.size(), [&](const std::string& l) { lines.push_back(l); },
         [&](const std::string& l) { status.push_back(l); });
  EXPECT_EQ(status, (std::vector<std::string>{"step 1"}));
  EXPECT_EQ(lines, (std::vector<std::string>{"step 2", "summary"}));
  // Segments ended by '\r' (the trainer's form), and CRLF: a status followed by '\n'
  // becomes a line too.
  LineSplitter trailing;
  lines.clear();
  status.clear();
  const std::string crlf = "step 1\rstep 2\r\nmsg\r\n\n";
  trailing.feed(crlf.data(), crlf.size(), [&](const std::string& l) { lines.push_back(l); },
                [&](const std::string& l) { status.push_back(l); });
  EXPECT_EQ(status, (std::vector<std::string>{"step 1", "step 2", "msg"}));
  EXPECT_EQ(lines, (std::vector<std::string>{"step 2", "msg", ""}));
  LineSplitter plain;
  lines.clear();
  plain.feed(text.data(), text.size(), [&](const std::string& l) { lines.push_back(l); });
  EXPECT_EQ(lines, (std::vector<std::string>{"\rstep 1\rstep 2", "summary"}));
}

std::string drain(int fd) {
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}

// What the router writes to a console (a terminal, a plain one, or none: the stream
// is redirected) and to a log file for a worker that prints `text`.
std::pair<std::string, std::string> route_text(const std::string& text, bool console_is_tty, bool console = true) {
  int source[2], out[2], log[2];
  EXPECT_EQ(::pipe(source), 0);
  EXPECT_EQ(::pipe(out), 0);
  EXPECT_EQ(::pipe(log), 0);
  OutputRouter router;
  OutputRouter::Route r;
  r.source_fd = source[0];
  r.console_fd = console ? out[1] : -1;
  r.log_fd = log[1];
  r.prefix = "[rank0]: ";
  r.console_is_tty = console_is_tty;
  router.add(r);
  EXPECT_EQ(::write(source[1], text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(source[1]);
  while (!router.open_fds().empty()) router.pump(source[0]);  // closes the log at the end
  ::close(out[1]);
  return {drain(out[0]), drain(log[0])};
}

// A worker that redraws a progress line.
std::pair<std::string, std::string> route_progress(bool console_is_tty) {
  return route_text("step 1\x1b[K\rstep 2\x1b[K\r\nsummary\n", console_is_tty);
}

TEST(OutputRouter, DrawsStatusInPlaceOnATerminalOnly) {
  auto [tty, tty_log] = route_progress(true);
  EXPECT_EQ(tty,
            "\r[rank0]: step 1\x1b[K"                        // drawn in place
            "\r[rank0]: step 2\x1b[K"                        // redrawn
            "\r\x1b[K[rank0]: step 2\x1b[K\n"                // done: cleared, kept as a line
            "[rank0]: summary\n");
  EXPECT_EQ(tty_log, "step 2\nsummary\n");  // no redraws and no escapes in the log
  auto [plain, plain_log] = route_progress(false);
  // Each segment once: the '\n' that finishes "step 2" does not print it again.
  EXPECT_EQ(plain, "[rank0]: step 1\x1b[K\n[rank0]: step 2\x1b[K\n[rank0]: summary\n");
  EXPECT_EQ(plain_log, tty_log);
}

TEST(OutputRouter, CrlfLinesAppearOnceOnAPlainConsole) {
  auto [plain, log] = route_text("first\r\nsecond\r\n", false);
  EXPECT_EQ(plain, "[rank0]: first\n[rank0]: second\n");
  EXPECT_EQ(log, "first\nsecond\n");
  auto [tty, tty_log] = route_text("first\r\n", true);
  EXPECT_EQ(tty, "\r[rank0]: first\r\x1b[K[rank0]: first\n");  // drawn, then kept as a line
  EXPECT_EQ(tty_log, "first\n");
}

TEST(OutputRouter, TextEndedByCarriageReturnReachesTheLogAtTheEnd) {
  // A redirected stream (-r): no console, only the log.
  auto [none, log] = route_text("epoch 1\n50%\r100%\r", false, false);
  EXPECT_EQ(none, "");
  EXPECT_EQ(log, "epoch 1\n100%\n");
  auto [plain, plain_log] = route_text("50%\r100%\r", false);
  EXPECT_EQ(plain, "[rank0]: 50%\n[rank0]: 100%\n");
  EXPECT_EQ(plain_log, "100%\n");
}

TEST(OutputRouter, AFailedLogWriteIsReportedOnce) {
  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  {
    OutputRouter router(report[1]);
    for (int i = 0; i < 2; ++i) {  // two workers' logs on a full disk
      int source[2];
      ASSERT_EQ(::pipe(source), 0);
      OutputRouter::Route r;
      r.source_fd = source[0];
      r.log_path = "/dev/full";
      router.add(r);
      const std::string text = "one\ntwo\nthree\n";
      ASSERT_EQ(::write(source[1], text.data(), text.size()), static_cast<ssize_t>(text.size()));
      ::close(source[1]);
    }
    while (!router.open_fds().empty())
      for (int fd : router.open_fds()) router.pump(fd);
  }
  ::close(report[1]);
  const auto reported = drain(report[0]);
  EXPECT_NE(reported.find("could not write the worker log /dev/full: No space left on device"), std::string::npos)
      << reported;
  EXPECT_NE(reported.find("fix: "), std::string::npos) << reported;
  EXPECT_EQ(reported.find("cohort run"), reported.rfind("cohort run")) << "reported more than once:\n" << reported;
}

TEST(OutputRouter, ALogThatCannotBeCreatedIsReported) {
  int source[2], report[2];
  ASSERT_EQ(::pipe(source), 0);
  ASSERT_EQ(::pipe(report), 0);
  {
    OutputRouter router(report[1]);
    OutputRouter::Route r;
    r.source_fd = source[0];
    r.log_path = "/nonexistent-cohort-dir/stdout.log";
    router.add(r);
    ::close(source[1]);
    router.close_all();
  }
  ::close(report[1]);
  EXPECT_NE(drain(report[0]).find("could not create the worker log /nonexistent-cohort-dir/stdout.log"),
            std::string::npos);
}

TEST(LineSplitter, FinishedStatusGoesToDoneAndTheTailIsNotLost) {
  LineSplitter s;
  std::vector<std::string> lines, status, done;
  auto line = [&](const std::string& l) { lines.push_back(l); };
  auto stat = [&](const std::string& l) { status.push_back(l); };
  auto fin = [&](const std::string& l) { done.push_back(l); };
  const std::string text = "a\r\nb\rc\r";
  s.feed(text.data(), text.size(), line, stat, fin);
  EXPECT_EQ(status, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(done, (std::vector<std::string>{"a"}));
  EXPECT_TRUE(lines.empty());
  s.finish(line, fin);
  EXPECT_EQ(done, (std::vector<std::string>{"a", "c"}));
  EXPECT_TRUE(lines.empty());
  // Without `done`, the status is emitted as a line at the end, once.
  LineSplitter plain;
  lines.clear();
  plain.feed("x\r", 2, line, stat);
  plain.finish(line);
  plain.finish(line);
  EXPECT_EQ(lines, (std::vector<std::string>{"x"}));
}

TEST(LineSplitter, SplitsOverlongLines) {
  LineSplitter s;
  std::vector<std::string> lines;
  std::string big(LineSplitter::kMaxLine + 10, 'x');
  s.feed(big.data(), big.size(), [&](const std::string& l) { lines.push_back(l); });
  s.finish([&](const std::string& l) { lines.push_back(l); });
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].size(), LineSplitter::kMaxLine);
  EXPECT_EQ(lines[1].size(), 10u);
}

TEST(StaticRendezvous, RanksFollowNodeOrder) {
  auto a = assign_ranks({2, 3, 1}, 1);
  EXPECT_EQ(a.base_rank, 2);
  EXPECT_EQ(a.world_size, 6);
  EXPECT_EQ(a.group_world_size, 3);
  EXPECT_EQ(assign_ranks({2, 3, 1}, 2).base_rank, 5);
  EXPECT_EQ(assign_ranks({4}, 0).base_rank, 0);
}

WorkerOutcome outcome(int rank, int status, bool stopped) {
  WorkerOutcome w;
  w.slot.rank = rank;
  w.slot.local_rank = rank;
  w.pid = 1000 + rank;
  w.wait_status = status;
  w.stopped_by_launcher = stopped;
  return w;
}

TEST(Failure, RootCauseIsTheFirstWorkerThatFailedOnItsOwn) {
  const int exit0 = 0, exit3 = 3 << 8, killed = SIGKILL, termed = SIGTERM;
  std::vector<WorkerOutcome> order{outcome(0, exit0, false), outcome(2, killed, false), outcome(1, exit3, false),
                                   outcome(3, termed, true)};
  ASSERT_NE(root_cause(order), nullptr);
  EXPECT_EQ(root_cause(order)->slot.rank, 2);
  auto text = failure_summary(order, {"host", "run", 0, 0});
  EXPECT_NE(text.find("rank 2 (local rank 2 on node 0, host host), pid 1002: signal SIGKILL (9)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("rank 1 (pid 1001): exit code 3"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 3 (pid 1003): signal SIGTERM (15), stopped by the launcher"), std::string::npos) << text;
  EXPECT_EQ(text.find("rank 0 (pid"), std::string::npos) << text;
}

TEST(Failure, PeerCasualtiesAreNotTheRootCause) {
  // Rank 0 saw the broken connection first; rank 1 threw but was still exiting when
  // the launcher stopped it (see Note [Root cause]).
  auto casualty = outcome(0, 1 << 8, false);
  casualty.error = cohort::elastic::ErrorRecord{"cohort::CommError: cohort: rank 0: barrier #1 failed", "", 0};
  auto culprit = outcome(1, SIGTERM, true);
  culprit.error = cohort::elastic::ErrorRecord{"std::runtime_error: boom", "", 0};
  // root_cause() points into its argument, so the vector must outlive `root` (ASan
  // caught the temporary it used to be, freed before the checks below read it).
  const std::vector<cohort::launcher::WorkerOutcome> outcomes{casualty, culprit};
  auto root = root_cause(outcomes);
  ASSERT_NE(root, nullptr);
  EXPECT_EQ(root->slot.rank, 1);
  EXPECT_TRUE(is_casualty(casualty));
  EXPECT_FALSE(is_casualty(culprit));
  // A worker killed by a signal leaves no error file, yet it beats a casualty that
  // was reaped before it.
  EXPECT_EQ(root_cause({casualty, outcome(2, SIGKILL, false)})->slot.rank, 2);
  // With nothing else, the first worker that failed on its own counts.
  EXPECT_EQ(root_cause({casualty, outcome(3, SIGTERM, true)})->slot.rank, 0);
}

TEST(Failure, GloosOwnTransportErrorIsACasualty) {
  // Seen in a run: rank 2 was SIGKILLed, and rank 0 exited first with Gloo's
  // exception, unwrapped; it was named as the root cause.
  auto transport = outcome(0, 1 << 8, false);
  transport.error = cohort::elastic::ErrorRecord{
      "gloo::IoException: [./gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:49838", "", 0};
  EXPECT_TRUE(is_casualty(transport));
  EXPECT_EQ(root_cause({transport, outcome(2, SIGKILL, false)})->slot.rank, 2);
}

TEST(Failure, AWorkerKilledBySigpipeIsACasualty) {
  // It wrote to a connection a dead peer had closed.
  auto broken_pipe = outcome(0, SIGPIPE, false);
  EXPECT_TRUE(is_casualty(broken_pipe));
  EXPECT_FALSE(is_casualty(outcome(1, SIGKILL, false)));
  EXPECT_EQ(root_cause({broken_pipe, outcome(1, SIGKILL, false)})->slot.rank, 1);
  // Alone, it is still named.
  EXPECT_EQ(root_cause({broken_pipe})->slot.rank, 0);
}

TEST(Failure, MessageComesFromTheErrorFile) {
  auto w = outcome(1, 1 << 8, false);
  w.error = cohort::elastic::ErrorRecord{"std::runtime_error: boom", "", 0};
  w.error_file = "/x/error.json";
  auto text = failure_summary({w}, {"h", "r", 0, 0});
  EXPECT_NE(text.find("message: std::runtime_error: boom"), std::string::npos) << text;
  EXPECT_NE(text.find("error file: /x/error.json"), std::string::npos) << text;
}

}  // namespace
