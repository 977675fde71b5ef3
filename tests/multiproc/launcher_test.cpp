// Real processes through `cohort run`: collectives across worlds of 1-4, and the
// launcher's handling of failures, signals and ranks that never join.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>
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
        "[rank1]: OMP_NUM_THREADS=1", "[rank0]: RANK=0", "[rank1]: TORCH_NCCL_ASYNC_ERROR_HANDLING=1",
        "[rank1]: NCCL_ASYNC_ERROR_HANDLING=1"})
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

// Gloo aborts a rank whose collective receives more bytes than it expects, from a
// thread no caller can catch (Note [Exceptions no caller can catch]): the summary
// still names that rank, what happened and the fix, instead of a bare SIGABRT.
TEST(Launcher, CollectivesOfDifferentSizesNameTheRankAndTheFix) {
  auto r = cohort::testing::run_process(cohort_run(2, {"mismatch", "1"}), 90s, {{"COHORT_TIMEOUT", "10"}});
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.err.find("root cause (first worker to fail):\n    rank 0 (local rank 0"), std::string::npos)
      << describe(r);
  EXPECT_NE(r.err.find("signal SIGABRT"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("op.preamble.length <= op.nbytes"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("different sizes; rerun with COHORT_CHECK_COLLECTIVES=1"), std::string::npos) << describe(r);
  EXPECT_LT(r.seconds, 60.0) << describe(r);
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

std::vector<std::string> static_node(int node_rank, const std::string& port, std::vector<std::string> worker_args) {
  return cohort_run(1, std::move(worker_args),
                    {"--nnodes", "2", "--node-rank", std::to_string(node_rank), "--master-addr", "127.0.0.1",
                     "--master-port", port});
}

using WallClock = std::chrono::system_clock;

long long wall_ms(WallClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

// Note [Static exit barrier]: node 0 hosts the store, so it must outlive every worker of the
// job. Node 0's worker exits at once; node 1's reads the store 4 s later.
TEST(Launcher, StaticNodeZeroOutlivesEveryWorker) {
  const auto port = std::to_string(cohort::testing::free_port());
  Subprocess node0(static_node(0, port, {"late_store", "4"}));
  Subprocess node1(static_node(1, port, {"late_store", "4"}));
  // Each launcher's exit is noted on its own thread, so that waiting for one never
  // delays noticing the other.
  ProcessResult r0;
  WallClock::time_point exit0;
  std::thread wait0([&] {
    r0 = node0.finish(120s);
    exit0 = WallClock::now();
  });
  auto r1 = node1.finish(120s);
  wait0.join();
  EXPECT_EQ(r0.exit_code, 0) << describe(r0);
  EXPECT_NE(r0.out.find("[rank0]: late store set"), std::string::npos) << describe(r0);
  EXPECT_EQ(r1.exit_code, 0) << "node 1's worker lost the store\n" << describe(r1);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r1.out, m, std::regex(R"(\[rank1\]: late store (.*) at_ms=(\d+))"))) << describe(r1);
  EXPECT_EQ(m[1].str(), "ok");
  // Causal order: node 1's worker printed this as its last act, and node 0 may only
  // leave after node 1 reported its workers done. (exit0 is noted late, never early.)
  EXPECT_GE(wall_ms(exit0), std::stoll(m[2])) << "node 0 exited before node 1's worker was done\n"
                                               << describe(r0) << "\n" << describe(r1);
}

TEST(Launcher, StaticExitBarrierStillStopsOnSigterm) {
  const auto port = std::to_string(cohort::testing::free_port());
  Subprocess node0(static_node(0, port, {"sleep_node", "1"}));
  Subprocess node1(static_node(1, port, {"sleep_node", "1"}));
  auto pids = start_sleepers(node1, 1);
  ASSERT_EQ(pids.size(), 1u);
  // Node 0's worker has exited; node 0 now waits for node 1's.
  ASSERT_TRUE(node0.read_until([&](const std::string&) { return node0.err().find("waits up to") != std::string::npos; },
                               60s))
      << node0.err();
  kill(node0.pid(), SIGTERM);
  auto r0 = node0.finish(30s);
  EXPECT_FALSE(r0.timed_out) << describe(r0);
  EXPECT_EQ(r0.exit_code, 128 + SIGTERM) << describe(r0);
  EXPECT_NE(r0.err.find("stopped by signal TERM while waiting for the other nodes"), std::string::npos)
      << describe(r0);
  kill(node1.pid(), SIGTERM);
  auto r1 = node1.finish(30s);
  EXPECT_FALSE(r1.timed_out) << describe(r1);
  EXPECT_TRUE(all_gone(pids, 5s));
}

// Note [Closing descriptors]: LibTorch's store opens pipes without close-on-exec.
TEST(Launcher, WorkersInheritOnlyStandardStreams) {
  for (const char* nnodes : {"1", "2"}) {
    SCOPED_TRACE(std::string("--nnodes ") + nnodes);
    if (std::string(nnodes) == "1") {
      auto r = cohort::testing::run_process(cohort_run(2, {"fds"}), 60s);
      ASSERT_EQ(r.exit_code, 0) << describe(r);
      EXPECT_EQ(count(r.out, ": fds: 0 1 2\n"), 2) << describe(r);
      continue;
    }
    const auto port = std::to_string(cohort::testing::free_port());
    Subprocess node0(static_node(0, port, {"fds"}));
    Subprocess node1(static_node(1, port, {"fds"}));
    auto r1 = node1.finish(60s);
    auto r0 = node0.finish(60s);
    ASSERT_EQ(r0.exit_code, 0) << describe(r0);
    ASSERT_EQ(r1.exit_code, 0) << describe(r1);
    EXPECT_NE(r0.out.find("[rank0]: fds: 0 1 2\n"), std::string::npos) << describe(r0);
    EXPECT_NE(r1.out.find("[rank1]: fds: 0 1 2\n"), std::string::npos) << describe(r1);
  }
}

// The listening TCP sockets of process `root` and its descendants, as /proc/net
// shows their local addresses ("0100007F:1F90", "[v6 hex]:PORT").
std::vector<std::string> listening_addresses(pid_t root) {
  std::map<pid_t, pid_t> parent;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const auto name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const auto close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(text.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    parent[std::stoi(name)] = ppid;
  }
  auto in_tree = [&](pid_t pid) {
    for (int hops = 0; pid > 1 && hops < 64; ++hops, pid = parent.count(pid) ? parent[pid] : 0)
      if (pid == root) return true;
    return false;
  };
  std::set<std::string> inodes;
  for (const auto& [pid, unused] : parent) {
    if (!in_tree(pid)) continue;
    std::error_code ec;
    for (const auto& fd : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
      auto target = std::filesystem::read_symlink(fd.path(), ec).string();
      if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, skip, inode;
      fields >> slot >> local >> remote >> state;
      for (int i = 0; i < 5; ++i) fields >> skip;
      fields >> inode;
      if (state == "0A" && inodes.count(inode)) out.push_back(local);
    }
  }
  return out;
}

// 127.0.0.0/8, ::1, or ::ffff:127.x.y.z, in /proc/net's hex (each 32-bit word in
// host order, little-endian here).
bool loopback(const std::string& address) {
  const auto host = address.substr(0, address.find(':'));
  if (host.size() == 8) return host.substr(6, 2) == "7F";
  return host == "00000000000000000000000001000000" ||
         (host.substr(0, 24) == "0000000000000000FFFF0000" && host.substr(30, 2) == "7F");
}

// Note [The workers' store]: a plain single-node run exposes nothing beyond this
// host, neither the launcher's store nor the workers' Gloo sockets; the opt-in
// TCPStore does (LibTorch's TCPStore binds every interface), which shows that the
// check can see it.
TEST(Launcher, ASingleNodeRunListensOnLoopbackOnly) {
  for (const bool tcpstore : {false, true}) {
    TempDir dir("cohort-loopback");
    std::vector<std::string> flags;
    if (tcpstore) flags = {"--rdzv-conf", "worker_store=tcpstore"};
    Subprocess launcher(cohort_run(2, {"joined_then_wait"}, flags), {{"COHORT_TEST_MARKER_DIR", dir.path}});
    const auto start = std::chrono::steady_clock::now();
    auto joined = [&] {
      return std::filesystem::exists(dir.path + "/joined.0") && std::filesystem::exists(dir.path + "/joined.1");
    };
    while (!joined() && std::chrono::steady_clock::now() - start < 60s) std::this_thread::sleep_for(100ms);
    EXPECT_TRUE(joined()) << "the workers did not join within 60 s";
    const auto addresses = listening_addresses(launcher.pid());
    std::ofstream(dir.path + "/go") << "go\n";
    auto r = launcher.finish(90s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_FALSE(addresses.empty()) << "no listening socket found: the check would prove nothing";
    const auto beyond = std::count_if(addresses.begin(), addresses.end(), [](auto& a) { return !loopback(a); });
    if (!tcpstore) {
      EXPECT_EQ(beyond, 0) << ::testing::PrintToString(addresses);
    } else {
      EXPECT_GE(beyond, 1) << "the opt-in TCPStore should listen beyond loopback: "
                           << ::testing::PrintToString(addresses);
      EXPECT_NE(r.err.find("worker_store=tcpstore: the workers' c10d TCPStore"), std::string::npos) << r.err;
    }
  }
}

// Note [Variables the launcher owns]: a static job started inside an elastic job's
// worker inherits that job's store variables.
TEST(Launcher, StaticWorkersDoNotFollowAnOuterJobsStore) {
  const std::map<std::string, std::string> outer{{"COHORT_AGENT_STORE", "cohort"},
                                                 {"COHORT_STORE_PREFIX", "/cohort/outer/round_0/worker"},
                                                 {"COHORT_RDZV_TOKEN", "outer-job-token-0123456789abcdef"},
                                                 {"COHORT_CONSOLE_TTY", "1"},
                                                 {"COHORT_JOIN_TIMEOUT", "10"},
                                                 {"COHORT_TIMEOUT", "10"}};
  // Its own store (Note [The workers' store]): a fresh token and its own prefix.
  auto env = cohort::testing::run_process(cohort_run(2, {"env"}), 60s, outer);
  ASSERT_EQ(env.exit_code, 0) << describe(env);
  EXPECT_NE(env.out.find("[rank1]: COHORT_AGENT_STORE=cohort\n"), std::string::npos) << describe(env);
  EXPECT_NE(env.out.find("[rank1]: COHORT_STORE_PREFIX=/cohort/static/attempt_0/worker\n"), std::string::npos)
      << describe(env);
  EXPECT_NE(env.out.find("[rank1]: COHORT_RDZV_TOKEN="), std::string::npos) << describe(env);
  EXPECT_EQ(env.out.find("outer-job-token"), std::string::npos) << describe(env);
  EXPECT_NE(env.out.find("[rank1]: COHORT_CONSOLE_TTY=<unset>"), std::string::npos) << describe(env);
  // A plain TCPStore: none of them.
  auto plain = cohort::testing::run_process(cohort_run(2, {"env"}, {"--rdzv-conf", "worker_store=tcpstore"}), 60s,
                                            outer);
  ASSERT_EQ(plain.exit_code, 0) << describe(plain);
  for (const char* name : {"COHORT_AGENT_STORE", "COHORT_STORE_PREFIX", "COHORT_RDZV_TOKEN", "COHORT_CONSOLE_TTY"})
    EXPECT_NE(plain.out.find(std::string("[rank1]: ") + name + "=<unset>"), std::string::npos) << name << "\n"
                                                                                                 << describe(plain);
  for (const auto& flags : {std::vector<std::string>{}, std::vector<std::string>{"--rdzv-conf", "worker_store=tcpstore"}}) {
    auto r = cohort::testing::run_process(cohort_run(2, {"collectives"}, flags), 90s, outer);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_NE(r.out.find("[rank1]: collectives ok rank 1 world 2"), std::string::npos) << describe(r);
  }
}

TEST(Launcher, RelativeLogDirGivesAbsoluteErrorFiles) {
  TempDir dir("cohort-relative");
  const auto root = std::filesystem::canonical(dir.path).string();
  std::vector<std::string> argv{"/bin/sh", "-c", "cd \"$0\" && exec \"$@\"", root};
  auto launch = cohort_run(2, {"env"}, {"--log-dir", "logs"});
  argv.insert(argv.end(), launch.begin(), launch.end());
  auto r = cohort::testing::run_process(argv, 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::regex error_file(R"(TORCHELASTIC_ERROR_FILE=(\S+))");
  int files = 0;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), error_file); it != std::sregex_iterator(); ++it) {
    ++files;
    EXPECT_EQ((*it)[1].str().rfind(root + "/logs/", 0), 0u) << "not absolute under the log dir: " << (*it)[1];
  }
  EXPECT_EQ(files, 2) << describe(r);
  EXPECT_NE(r.err.find("worker logs and error files in " + root + "/logs/"), std::string::npos) << describe(r);
}

// Note [Progress lines], on a console that is not a terminal (the test's pipe) and in
// a log.
TEST(Launcher, CarriageReturnsNeitherRepeatNorLoseOutput) {
  auto plain = cohort::testing::run_process(cohort_run(1, {"progress"}), 60s);
  ASSERT_EQ(plain.exit_code, 0) << describe(plain);
  EXPECT_EQ(count(plain.out, "[rank0]: crlf line\n"), 1) << describe(plain);
  EXPECT_EQ(count(plain.out, "[rank0]: 100%\n"), 1) << describe(plain);
  TempDir dir("cohort-progress");
  auto redirected =
      cohort::testing::run_process(cohort_run(1, {"progress"}, {"--log-dir", dir.path, "--redirects", "1"}), 60s);
  ASSERT_EQ(redirected.exit_code, 0) << describe(redirected);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(redirected.err, m, std::regex("worker logs and error files in (\\S+)")))
      << describe(redirected);
  std::ifstream log(std::string(m[1]) + "/attempt_0/0/stdout.log");
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_EQ(text.str(), "crlf line\n100%\n");
}

// Note [Never stalled by the console]: nobody reads the launcher's stdout and stderr
// for 30 s while each worker prints 256 KiB, four pipes' worth. The workers still get
// all of it out (each then leaves a file), the launcher lives on, and once reading
// resumes the job ends well and every line arrives: 512 KiB fits the relay's buffer.
TEST(Launcher, AConsoleThatStopsReadingFor30SecondsStallsNothing) {
  TempDir dir("cohort-paused");
  const auto start = std::chrono::steady_clock::now();
  Subprocess launcher(cohort_run(2, {"flood_then_wait"}), {{"COHORT_TEST_MARKER_DIR", dir.path}});
  auto flooded = [&] {
    return std::filesystem::exists(dir.path + "/flooded.0") && std::filesystem::exists(dir.path + "/flooded.1");
  };
  while (!flooded() && std::chrono::steady_clock::now() - start < 30s) std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(flooded()) << "the workers were held up: the launcher blocked on a console nobody read";
  std::this_thread::sleep_until(start + 30s);
  EXPECT_FALSE(cohort::testing::process_gone(launcher.pid())) << "the launcher ended while nobody read its console";
  std::ofstream(dir.path + "/go") << "go\n";
  auto r = launcher.finish(90s);
  EXPECT_EQ(r.exit_code, 0) << "exit " << r.exit_code << " signal " << r.signal << "\n" << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const auto prefix = "[rank" + std::to_string(rank) + "]: ";
    EXPECT_EQ(count(r.out, prefix + "flood "), 4000) << r.err;
    EXPECT_NE(r.out.find(prefix + "done\n"), std::string::npos) << r.err;
  }
  EXPECT_EQ(r.out.find("of output dropped"), std::string::npos);
}

// A log folder on a full disk: a 16 KiB tmpfs in a mount namespace of the launcher's
// own (root only), so that nothing outside the test sees it.
TEST(Launcher, AFullLogDiskIsReportedOnce) {
  if (geteuid() != 0 || access("/usr/bin/unshare", X_OK) != 0) GTEST_SKIP() << "needs root and unshare(1)";
  TempDir dir("cohort-full");
  std::vector<std::string> argv{"/usr/bin/unshare", "-m", "/bin/sh", "-c",
                                "mount -t tmpfs -o size=16k cohort-full \"$0\" || exit 99; exec \"$@\"", dir.path};
  auto launch = cohort_run(2, {"flood"}, {"--log-dir", dir.path, "--redirects", "1"});
  argv.insert(argv.end(), launch.begin(), launch.end());
  auto r = cohort::testing::run_process(argv, 60s);
  if (r.exit_code == 99) GTEST_SKIP() << "cannot mount a tmpfs here: " << r.err;
  EXPECT_EQ(r.exit_code, 0) << "a full log disk must not fail the job\n" << describe(r);
  EXPECT_EQ(count(r.err, "could not write the worker log " + dir.path), 1) << describe(r);
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << describe(r);
  EXPECT_EQ(count(r.err, "cohort run: error:"), 1) << describe(r);
}

}  // namespace
