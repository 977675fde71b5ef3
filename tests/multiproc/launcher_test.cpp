// Real processes through `cohort run`: collectives across worlds of 1-4, and the
// launcher's handling of failures, signals and ranks that never join.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "support/subprocess.h"

namespace {

using cohort::testing::ProcessResult;
using cohort::testing::Subprocess;
using namespace std::chrono_literals;

const std::string kCohort = COHORT_CLI_PATH;
const std::string kWorker = COHORT_TEST_WORKER_PATH;

std::vector<std::string> cohort_run(int nproc, std::vector<std::string> worker_args,
                                    std::vector<std::string> flags = {}) {
  std::vector<std::string> argv{kCohort, "run", "--nproc-per-node", std::to_string(nproc), "--stop-timeout", "3"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(kWorker);
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

int count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (auto pos = haystack.find(needle); pos != std::string::npos; pos = haystack.find(needle, pos + 1)) ++n;
  return n;
}

std::string describe(const ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + " signal " + std::to_string(r.signal) +
         (r.timed_out ? " TIMED OUT" : "") + "\n--- stdout\n" + r.out + "\n--- stderr\n" + r.err;
}

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, ExactResultsOnEveryRank) {
  const int n = GetParam();
  auto r = cohort::testing::run_process(cohort_run(n, {"collectives"}), 120s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (int rank = 0; rank < n; ++rank) {
    std::string line = "[rank" + std::to_string(rank) + "]: collectives ok rank " + std::to_string(rank) +
                       " world " + std::to_string(n) + " sum " + std::to_string(n * (n - 1) / 2);
    EXPECT_NE(r.out.find(line), std::string::npos) << "missing: " << line << "\n" << describe(r);
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, Collectives, ::testing::Values(1, 2, 3, 4));

TEST(Launcher, SubGroupsReduceOverTheirOwnRanks) {
  auto r = cohort::testing::run_process(cohort_run(4, {"subgroups"}), 120s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("[rank2]: subgroup ok rank 2 group rank 1 sum 2"), std::string::npos) << describe(r);
  EXPECT_NE(r.out.find("[rank3]: subgroup ok rank 3 group rank 1 sum 4"), std::string::npos) << describe(r);
}

TEST(Launcher, WorkerEnvironmentMatchesTorchrun) {
  auto r = cohort::testing::run_process(cohort_run(2, {"env"}, {"--rdzv-id", "job42", "--max-restarts", "0"}), 60s,
                                        {{"OMP_NUM_THREADS", ""}});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (const char* expected :
       {"[rank1]: RANK=1", "[rank1]: LOCAL_RANK=1", "[rank1]: GROUP_RANK=0", "[rank1]: ROLE_RANK=1",
        "[rank1]: ROLE_NAME=default", "[rank1]: LOCAL_WORLD_SIZE=2", "[rank1]: WORLD_SIZE=2",
        "[rank1]: GROUP_WORLD_SIZE=1", "[rank1]: ROLE_WORLD_SIZE=2", "[rank1]: MASTER_ADDR=127.0.0.1",
        "[rank1]: TORCHELASTIC_RESTART_COUNT=0", "[rank1]: TORCHELASTIC_MAX_RESTARTS=0",
        "[rank1]: TORCHELASTIC_RUN_ID=job42", "[rank1]: TORCHELASTIC_USE_AGENT_STORE=True",
        "[rank1]: OMP_NUM_THREADS=1", "[rank0]: RANK=0"})
    EXPECT_NE(r.out.find(expected), std::string::npos) << expected << "\n" << describe(r);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(\[rank0\]: MASTER_PORT=(\d+))"))) << describe(r);
  EXPECT_GT(std::stoi(m[1]), 0);
  // Each worker gets its own error file.
  std::set<std::string> files;
  const std::regex error_file(R"(TORCHELASTIC_ERROR_FILE=(\S+))");
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), error_file);
       it != std::sregex_iterator(); ++it)
    files.insert((*it)[1]);
  EXPECT_EQ(files.size(), 2u) << describe(r);
}

TEST(Launcher, LinesStayWholeAndPrefixed) {
  auto r = cohort::testing::run_process(cohort_run(4, {"chatter"}), 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  std::istringstream in(r.out);
  std::string line;
  int lines = 0;
  std::regex shape(R"(\[rank(\d)\]: line \d+ from rank (\d) end)");
  while (std::getline(in, line)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, shape)) << "torn or unprefixed line: '" << line << "'";
    EXPECT_EQ(m[1], m[2]);
    ++lines;
  }
  EXPECT_EQ(lines, 800);
}

TEST(Launcher, LocalRanksFilterShowsOnlyChosenRanks) {
  auto r = cohort::testing::run_process(cohort_run(3, {"chatter"}, {"--local-ranks-filter", "1"}), 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(count(r.out, "[rank1]: "), 200);
  EXPECT_EQ(count(r.out, "[rank0]: "), 0);
  EXPECT_EQ(count(r.out, "[rank2]: "), 0);
}

TEST(Launcher, RedirectsAndTeeWriteLogFiles) {
  char tmpl[] = "/tmp/cohort-logs-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  auto r = cohort::testing::run_process(
      cohort_run(2, {"chatter"}, {"--log-dir", dir, "--redirects", "0:1", "--tee", "1:1"}), 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(count(r.out, "[rank0]: "), 0) << "rank 0's stdout was redirected";
  EXPECT_EQ(count(r.out, "[rank1]: "), 200) << "rank 1's stdout was teed";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex("worker logs and error files in (\\S+)"))) << describe(r);
  for (int local : {0, 1}) {
    std::ifstream log(std::string(m[1]) + "/attempt_0/" + std::to_string(local) + "/stdout.log");
    std::stringstream text;
    text << log.rdbuf();
    EXPECT_EQ(count(text.str(), "from rank " + std::to_string(local) + " end\n"), 200) << "local rank " << local;
  }
  std::filesystem::remove_all(dir);
}

TEST(Launcher, WorkerThatThrowsIsNamedWithItsMessage) {
  auto r = cohort::testing::run_process(cohort_run(3, {"throw", "1"}), 60s);
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.err.find("root cause (first worker to fail):\n    rank 1 (local rank 1"), std::string::npos)
      << describe(r);
  EXPECT_NE(r.err.find("exit code 1"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("message: "), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("boom from rank 1"), std::string::npos) << describe(r);
  EXPECT_LT(r.seconds, 30.0) << "the others must be stopped within --stop-timeout";
}

TEST(Launcher, WorkerKilledBySignalIsNamedWithTheSignal) {
  auto r = cohort::testing::run_process(cohort_run(3, {"sigkill", "2"}), 60s);
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.err.find("rank 2 (local rank 2"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("signal SIGKILL (9)"), std::string::npos) << describe(r);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"(rank 2 \(local rank 2 on node 0, host \S+\), pid (\d+))")))
      << describe(r);
}

TEST(Launcher, RankThatNeverJoinsIsNamedWithinTheBound) {
  auto r = cohort::testing::run_process(cohort_run(3, {"absent", "2"}), 90s, {{"COHORT_JOIN_TIMEOUT", "3"}});
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.err.find("missing: rank 2"), std::string::npos) << describe(r);
  EXPECT_LT(r.seconds, 45.0) << describe(r);
}

TEST(Launcher, StalledRankIsNamedInTheCollectiveTimeout) {
  auto r = cohort::testing::run_process(cohort_run(3, {"stall", "1"}), 90s, {{"COHORT_TIMEOUT", "3"}});
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.err.find("timed out after 3.0 s in all_reduce"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("not arrived: rank 1 (alive, but still at barrier"), std::string::npos) << describe(r);
}

std::vector<pid_t> ready_pids(const std::string& out) {
  std::vector<pid_t> pids;
  const std::regex ready(R"(ready pid=(\d+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), ready);
       it != std::sregex_iterator(); ++it)
    pids.push_back(std::stoi((*it)[1]));
  return pids;
}

bool all_gone(const std::vector<pid_t>& pids, std::chrono::milliseconds within) {
  auto deadline = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < deadline) {
    bool gone = true;
    for (auto p : pids) gone = gone && cohort::testing::process_gone(p);
    if (gone) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// Starts `n` sleeping workers and returns their pids once all have said so.
std::vector<pid_t> start_sleepers(Subprocess& launcher, size_t n) {
  bool ready = launcher.read_until([n](const std::string& out) { return ready_pids(out).size() == n; }, 60s);
  EXPECT_TRUE(ready) << launcher.out();
  return ready_pids(launcher.out());
}

TEST(Launcher, SigtermToLauncherStopsEveryWorker) {
  Subprocess launcher(cohort_run(3, {"sleep"}));
  auto pids = start_sleepers(launcher, 3);
  ASSERT_EQ(pids.size(), 3u);
  kill(launcher.pid(), SIGTERM);
  auto r = launcher.finish(30s);
  EXPECT_FALSE(r.timed_out) << describe(r);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << describe(r);
  EXPECT_TRUE(all_gone(pids, 5s));
}

TEST(Launcher, KillingTheLauncherTakesItsWorkersWithIt) {
  char tmpl[] = "/tmp/cohort-kill9-XXXXXX";
  std::string dir = mkdtemp(tmpl);  // a launcher killed -9 cannot clean up after itself
  Subprocess launcher(cohort_run(2, {"sleep"}, {"--log-dir", dir}));
  auto pids = start_sleepers(launcher, 2);
  ASSERT_EQ(pids.size(), 2u);
  kill(launcher.pid(), SIGKILL);
  launcher.finish(10s);
  EXPECT_TRUE(all_gone(pids, 5s)) << "orphaned workers survived the launcher";
  std::filesystem::remove_all(dir);
}

TEST(Launcher, MaxRestartsRestartsTheWholeGroup) {
  auto r = cohort::testing::run_process(cohort_run(2, {"throw", "0"}, {"--max-restarts", "1"}), 90s);
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_EQ(count(r.err, "the job failed"), 2) << describe(r);
  EXPECT_NE(r.err.find("restarting every worker (restart 1 of 1)"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("attempt 1"), std::string::npos) << describe(r);
}

TEST(Launcher, TwoStaticNodesFormOneWorld) {
  auto port = std::to_string(cohort::testing::free_port());
  std::vector<std::string> common{"--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port};
  auto node = [&](const char* rank) {
    auto flags = common;
    flags.insert(flags.end(), {"--node-rank", rank});
    return cohort_run(2, {"collectives"}, flags);
  };
  Subprocess node0(node("0"));
  Subprocess node1(node("1"));
  auto r1 = node1.finish(120s);
  auto r0 = node0.finish(120s);
  ASSERT_EQ(r0.exit_code, 0) << describe(r0);
  ASSERT_EQ(r1.exit_code, 0) << describe(r1);
  EXPECT_NE(r0.out.find("[rank1]: collectives ok rank 1 world 4 sum 6"), std::string::npos) << describe(r0);
  EXPECT_NE(r1.out.find("[rank3]: collectives ok rank 3 world 4 sum 6"), std::string::npos) << describe(r1);
}

}  // namespace
