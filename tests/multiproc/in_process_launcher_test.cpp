// `cohort run --fault-tolerance in-process` with real processes: a dead worker is
// restarted alone, the others keep running (same pids), the death is on the job's
// store where a worker sees it, and the job's exit code follows every worker's last
// incarnation (launcher/in_process.h).
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace {

using cohort::testing::ProcessResult;
using cohort::testing::Subprocess;
using cohort::testing::TempDir;
using namespace std::chrono_literals;

const std::string kCohort = COHORT_CLI_PATH;
const std::string kWorker = COHORT_TEST_WORKER_PATH;

std::vector<std::string> ft_run(int nproc, std::vector<std::string> flags, std::vector<std::string> worker_args) {
  std::vector<std::string> argv{kCohort, "run", "--nproc-per-node", std::to_string(nproc), "--stop-timeout", "3",
                                "--fault-tolerance", "in-process"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(kWorker);
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

std::string describe(const ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + " signal " + std::to_string(r.signal) +
         (r.timed_out ? " TIMED OUT" : "") + "\n--- stdout\n" + r.out + "\n--- stderr\n" + r.err;
}

// "ft start|exit rank=R incarnation=I pid=P" lines: pid by (rank, incarnation).
using Pids = std::map<std::pair<int, int>, int>;
Pids ft_pids(const std::string& out, const std::string& what) {
  Pids pids;
  const std::regex line("ft " + what + R"( rank=(\d+) incarnation=(\d+) pid=(\d+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator(); ++it)
    pids[{std::stoi((*it)[1]), std::stoi((*it)[2])}] = std::stoi((*it)[3]);
  return pids;
}

bool started(const std::string& out, int rank, int incarnation) {
  return ft_pids(out, "start").count({rank, incarnation}) > 0;
}

// The "ft env" line of (rank, incarnation), without its error file, and the error file.
std::pair<std::string, std::string> ft_env(const std::string& out, int rank, int incarnation) {
  std::smatch m;
  const std::regex line("ft env rank=" + std::to_string(rank) + " incarnation=" + std::to_string(incarnation) +
                        R"( (.*) TORCHELASTIC_ERROR_FILE=(\S+))");
  if (!std::regex_search(out, m, line)) return {};
  return {m[1], m[2]};
}

void stop_workers(const TempDir& dir) { std::ofstream(dir.path + "/stop") << "stop\n"; }

bool all_gone(const std::vector<pid_t>& pids, std::chrono::milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < deadline) {
    bool gone = true;
    for (auto p : pids) gone = gone && cohort::testing::process_gone(p);
    if (gone) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

TEST(InProcess, ADeadWorkerIsRestartedAloneAndTheOthersKeepTheirPids) {
  TempDir dir("cohort-ft");
  Subprocess launcher(ft_run(3, {"--max-restarts", "2", "--min-replicas", "2"}, {"ft", "1", "1"}),
                      {{"COHORT_TEST_MARKER_DIR", dir.path}});
  ASSERT_TRUE(launcher.read_until(
      [](const std::string& out) { return started(out, 0, 0) && started(out, 2, 0) && started(out, 1, 1); }, 60s))
      << launcher.out() << launcher.err();
  stop_workers(dir);
  auto r = launcher.finish(60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const auto starts = ft_pids(r.out, "start"), exits = ft_pids(r.out, "exit");
  // The survivors ran once, start to end, in the same process.
  for (int rank : {0, 2}) {
    ASSERT_EQ(starts.count({rank, 0}), 1u) << describe(r);
    ASSERT_EQ(exits.count({rank, 0}), 1u) << describe(r);
    EXPECT_EQ(starts.at({rank, 0}), exits.at({rank, 0})) << "rank " << rank << " was restarted\n" << describe(r);
    EXPECT_EQ(starts.count({rank, 1}), 0u) << describe(r);
    // A survivor reads the death through its own PrefixStore(COHORT_STORE_PREFIX, client).
    EXPECT_NE(r.out.find("[rank" + std::to_string(rank) + "]: ft keys dead=0 event1=dead 1 0\n"), std::string::npos)
        << describe(r);
  }
  // Rank 1 died in incarnation 0 and its replacement ran to the end.
  EXPECT_EQ(exits.count({1, 0}), 0u) << describe(r);
  ASSERT_EQ(exits.count({1, 1}), 1u) << describe(r);
  EXPECT_EQ(starts.count({1, 2}), 0u) << describe(r);
  EXPECT_NE(r.err.find("cohort run: worker 1 (incarnation 0, pid " + std::to_string(starts.at({1, 0})) +
                       ") was killed by SIGKILL; restarting only this worker (fault tolerance in-process, restart 1 "
                       "of 2)\n"),
            std::string::npos)
      << describe(r);
  // Note [A replacement is its rank]: the same environment, a fresh error file.
  const auto first = ft_env(r.out, 1, 0), second = ft_env(r.out, 1, 1);
  ASSERT_FALSE(first.first.empty()) << describe(r);
  EXPECT_EQ(first.first, second.first) << describe(r);
  EXPECT_NE(first.second, second.second) << describe(r);
  EXPECT_NE(second.second.find("/attempt_0/1_1/error.json"), std::string::npos) << second.second;
  for (const char* expected : {"RANK=1 LOCAL_RANK=1 ", "COHORT_STORE_PREFIX=/cohort/static/attempt_0/worker ",
                               "COHORT_FAULT_TOLERANCE=in-process COHORT_FT_MIN_REPLICAS=2 ",
                               "TORCHELASTIC_RESTART_COUNT=0"})
    EXPECT_NE(first.first.find(expected), std::string::npos) << expected << "\n" << first.first;
  EXPECT_EQ(r.err.find("restarting every worker"), std::string::npos) << describe(r);
  EXPECT_EQ(r.err.find("the job failed"), std::string::npos) << describe(r);
}

// Under worker_store=tcpstore the workers' prefix is torchrun's, /worker/attempt_0.
TEST(InProcess, TheDeathIsWhereTheWorkersLookOnATcpStoreToo) {
  TempDir dir("cohort-ft-tcp");
  Subprocess launcher(ft_run(2, {"--max-restarts", "1", "--rdzv-conf", "worker_store=tcpstore"}, {"ft", "0", "1"}),
                      {{"COHORT_TEST_MARKER_DIR", dir.path}});
  ASSERT_TRUE(launcher.read_until([](const std::string& out) { return started(out, 1, 0) && started(out, 0, 1); },
                                  60s))
      << launcher.out() << launcher.err();
  stop_workers(dir);
  auto r = launcher.finish(60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("[rank1]: ft keys dead=0 event1=dead 0 0\n"), std::string::npos) << describe(r);
  EXPECT_NE(r.out.find("[rank0]: ft exit rank=0 incarnation=1"), std::string::npos) << describe(r);
}

TEST(InProcess, ASpentBudgetFailsTheJobButStopsNoOne) {
  TempDir dir("cohort-ft-spent");
  // Rank 1 dies in every incarnation; one restart is allowed.
  Subprocess launcher(ft_run(3, {"--max-restarts", "1"}, {"ft", "1", "99"}), {{"COHORT_TEST_MARKER_DIR", dir.path}});
  const std::string spent = "; not replaced: --max-restarts 1 spent; the others go on\n";
  ASSERT_TRUE(launcher.read_until([&](const std::string&) { return launcher.err().find(spent) != std::string::npos; },
                                  60s))
      << launcher.out() << launcher.err();
  // Past the settle window of a normal failure (1 s), nobody has been stopped.
  EXPECT_FALSE(launcher.read_until([](const std::string& out) { return out.find("ft exit") != std::string::npos; },
                                   1500ms))
      << launcher.out() << launcher.err();
  EXPECT_FALSE(cohort::testing::process_gone(launcher.pid()));
  stop_workers(dir);
  auto r = launcher.finish(60s);
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  const auto starts = ft_pids(r.out, "start"), exits = ft_pids(r.out, "exit");
  for (int rank : {0, 2}) {
    ASSERT_EQ(exits.count({rank, 0}), 1u) << "rank " << rank << " was stopped early\n" << describe(r);
    EXPECT_EQ(starts.at({rank, 0}), exits.at({rank, 0})) << describe(r);
    EXPECT_NE(r.out.find("[rank" + std::to_string(rank) + "]: ft keys dead=1 event1=dead 1 0\n"), std::string::npos)
        << describe(r);
  }
  EXPECT_EQ(starts.count({1, 1}), 1u) << describe(r);
  EXPECT_EQ(starts.count({1, 2}), 0u) << describe(r);
  EXPECT_NE(r.err.find("worker 1 (incarnation 1, pid " + std::to_string(starts.at({1, 1})) +
                       ") was killed by SIGKILL" + spent),
            std::string::npos)
      << describe(r);
  EXPECT_NE(r.err.find("the job failed"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("1 worker(s) not replaced or failed in their last incarnation, 1 of --max-restarts 1"),
            std::string::npos)
      << describe(r);
}

TEST(InProcess, AStoppedWorkerIsNotKilledPastTheFrozenTimeout) {
  TempDir dir("cohort-ft-frozen");
  Subprocess launcher(ft_run(2, {"--frozen-timeout", "1"}, {"ft", "-1"}), {{"COHORT_TEST_MARKER_DIR", dir.path}});
  ASSERT_TRUE(launcher.read_until([](const std::string& out) { return started(out, 0, 0) && started(out, 1, 0); },
                                  60s))
      << launcher.out() << launcher.err();
  const pid_t frozen = ft_pids(launcher.out(), "start").at({1, 0});
  ASSERT_EQ(kill(frozen, SIGSTOP), 0);
  const std::string note = "cohort run: worker 1 (incarnation 0, pid " + std::to_string(frozen) +
                           ") has been stopped (SIGSTOP) for over 1 s (--frozen-timeout); not killed";
  const bool noted =
      launcher.read_until([&](const std::string&) { return launcher.err().find(note) != std::string::npos; }, 30s);
  // Another second stopped: still alive.
  launcher.read_until([](const std::string&) { return false; }, 1s);
  const bool alive = !cohort::testing::process_gone(frozen);
  kill(frozen, SIGCONT);
  stop_workers(dir);
  auto r = launcher.finish(60s);
  EXPECT_TRUE(noted) << describe(r);
  EXPECT_TRUE(alive) << describe(r);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  const auto exits = ft_pids(r.out, "exit");
  EXPECT_EQ(exits.count({1, 0}) ? exits.at({1, 0}) : -1, frozen) << describe(r);
  EXPECT_EQ(r.err.find("hung"), std::string::npos) << describe(r);
}

TEST(InProcess, SigtermToTheLauncherStillStopsEveryWorker) {
  TempDir dir("cohort-ft-term");
  Subprocess launcher(ft_run(3, {"--max-restarts", "1"}, {"ft", "2", "1"}), {{"COHORT_TEST_MARKER_DIR", dir.path}});
  ASSERT_TRUE(launcher.read_until(
      [](const std::string& out) { return started(out, 0, 0) && started(out, 1, 0) && started(out, 2, 1); }, 60s))
      << launcher.out() << launcher.err();
  std::vector<pid_t> pids;
  for (const auto& [who, pid] : ft_pids(launcher.out(), "start")) pids.push_back(pid);
  kill(launcher.pid(), SIGTERM);
  auto r = launcher.finish(30s);
  EXPECT_FALSE(r.timed_out) << describe(r);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << describe(r);
  EXPECT_TRUE(all_gone(pids, 5s)) << describe(r);
  EXPECT_EQ(r.out.find("ft exit"), std::string::npos) << describe(r);
}

TEST(InProcess, UsageErrorsExitTwoAndNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--fault-tolerance", "always"}, "--fault-tolerance always"},
      {{"--min-replicas", "2"}, "--min-replicas only applies to --fault-tolerance in-process"},
      {{"--fault-tolerance", "in-process", "--min-replicas", "0"}, "--min-replicas 0"},
      {{"--fault-tolerance", "in-process", "--nproc-per-node", "2", "--min-replicas", "3"},
       "--min-replicas 3: the job has only 2"},
      {{"--fault-tolerance", "in-process", "--nproc-per-node", "auto", "--min-replicas", "100000"},
       "--min-replicas 100000: the job has only"},
      {{"--fault-tolerance", "in-process", "--standalone"}, "--standalone yet"},
      {{"--fault-tolerance", "in-process", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400",
        "--rdzv-conf", "worker_store=tcpstore"},
       "worker_store=tcpstore yet"},
      // Several static nodes are taken in this mode; restarting every worker of
      // several nodes (the default mode) is still refused, before any port is bound.
      {{"--nnodes", "2", "--master-port", "29400", "--max-restarts", "1"},
       "--max-restarts: restarting a job of several nodes needs the elastic rendezvous"},
  };
  for (const auto& [flags, needle] : cases) {
    std::vector<std::string> argv{kCohort, "run"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {kWorker, "ft", "-1"});
    auto r = cohort::testing::run_process(argv, 30s);
    EXPECT_EQ(r.exit_code, 2) << ::testing::PrintToString(flags) << "\n" << describe(r);
    EXPECT_NE(r.err.find(needle), std::string::npos) << needle << "\n" << describe(r);
  }
}

}  // namespace
