// `cohort run --rdzv-backend etcd` in real processes (issue 47, no single point of
// failure): the job's rendezvous, its workers' store and its fault-tolerance keys
// live in a real 3-member etcd cluster on loopback (tests/support/etcd_cluster.h),
// so no agent hosts anything. The agent that started first (the one that would
// host the store under --rdzv-backend c10d) is killed -9 together with an etcd
// member, and the in-process fault-tolerant job trains on with the survivors to the
// one-process reference; an etcd that loses its quorum stops the job with an error
// that names etcd.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>

#include "multiproc/fault_tolerance/ft_harness.h"
#include "support/etcd_cluster.h"

using namespace std::chrono_literals;
using namespace cohort::testing::ft;

namespace {

int job_counter = 0;

// A run id of this test process's own, so that nothing of another job is read.
std::string fresh_run_id() { return "etcd-" + std::to_string(::getpid()) + "-" + std::to_string(++job_counter); }

std::vector<std::string> etcd_flags(const cohort::testing::EtcdCluster& cluster, const std::string& run_id,
                                    const std::string& nnodes) {
  // A heartbeat bound (3 x 2 s) well above an etcd election's (about 1 s here).
  return {"--nnodes",  nnodes, "--rdzv-backend", "etcd", "--rdzv-endpoint", cluster.endpoint_list(), "--rdzv-id", run_id,
          "--rdzv-conf", "join_timeout=60,last_call_timeout=1,keep_alive_interval=2"};
}

std::vector<std::string> without_hold(std::vector<std::string> argv) {
  argv.erase(std::find(argv.begin(), argv.end(), "--hold-last-step"));
  return argv;
}

// The first rank of the node whose agent wrote `err`, or -1 before its round line.
int first_rank_of(const std::string& err) {
  std::smatch m;
  static const std::regex line("round 0: node \\d of 2, ranks (\\d+)\\.\\.\\d+ of 3");
  return std::regex_search(err, m, line) ? std::stoi(m[1]) : -1;
}

bool gone_within(pid_t pid, std::chrono::seconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (::kill(pid, 0) == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(50ms);
  return ::kill(pid, 0) != 0;
}

std::string keys_of(const cohort::testing::EtcdCluster& cluster, const std::string& run_id) {
  return cluster.etcdctl({"get", "--prefix", "cohort/" + run_id + "/", "--keys-only"}).out;
}

// The harness's settings, but a quorum that waits (5 s) longer than a collective
// (3 s): a survivor that was waiting on the lost replica in a collective, rather
// than seeing its socket close, arrives after the other survivor, and must still be
// waited for (with the harness's 2 s it was left out, and the other trained to the
// end alone before it came back: seen in this test's first runs).
std::map<std::string, std::string> etcd_ft_env() {
  auto env = ft_env();
  env["COHORT_FT_QUORUM_TIMEOUT"] = "5";
  return env;
}

// Node A (started first, one replica) stops its replica in step 4 and is then
// killed -9 with the etcd leader; node B's two replicas drop it at their deadline
// and train to the end in the same round, through the two etcd members left.
TEST_F(FaultTolerance, UnderEtcdTheFirstNodeAndAnEtcdMemberAreLostAndTheJobGoesOn) {
  cohort::testing::EtcdCluster cluster(3);
  cohort::testing::TempDir dir("cohort-ft-etcd");
  const auto id = fresh_run_id();
  cohort::testing::Subprocess first(
      without_hold(launch(dir.path, {"--stop", "*:4"}, etcd_flags(cluster, id, "2"), 1)), etcd_ft_env());
  cohort::testing::Subprocess second(without_hold(launch(dir.path, {}, etcd_flags(cluster, id, "2"), 2)),
                                     etcd_ft_env());
  std::smatch m;
  const std::regex stopping("replica (\\d): stopping at step 4 pid (\\d+)");
  ASSERT_TRUE(first.read_until([&](const std::string& out) { return std::regex_search(out, m, stopping); }, 90s))
      << first.out() << first.err() << second.err();
  const int vanished = std::stoi(m[1]);
  const pid_t worker = std::stoi(m[2]);
  ASSERT_EQ(first_rank_of(first.err()), vanished) << first.err();
  EXPECT_EQ(first.err().find("hosts the rendezvous store"), std::string::npos) << first.err();
  ::kill(first.pid(), SIGKILL);
  const int leader = cluster.leader();
  cluster.kill(leader >= 0 ? leader : 0);
  const auto killed = first.finish(30s);
  ASSERT_TRUE(gone_within(worker, 10s)) << "the killed node's worker outlived its agent";
  auto r = second.finish(180s);
  r.err += "\n--- the killed node's agent\n" + describe(killed);
  ASSERT_FALSE(r.timed_out) << describe(r);
  ASSERT_EQ(r.exit_code, 0) << describe(r) << "\n--- etcd\n" << cluster.logs();
  EXPECT_EQ(r.err.find("lost the job's etcd"), std::string::npos) << describe(r);
  EXPECT_EQ(r.err.find("round 1"), std::string::npos) << "no node's workers restart\n" << describe(r);
  for (int replica = 0; replica < kReplicas; ++replica) {
    if (replica == vanished) continue;
    expect_survivor_committed_all(r, replica);
    EXPECT_LT(max_diff(load(dir.path + "/final_" + std::to_string(replica) + ".pt"), reference_), 2e-5)
        << describe(r);
  }
  // Note [A finished job's keys in etcd]: the last agent out deleted the job's keys.
  EXPECT_EQ(keys_of(cluster, id), "") << describe(r);
}

// Two of the three etcd members die while the job trains: no member can serve the
// agent, which stops its workers and says that etcd lost its quorum, within its
// heartbeat bound and a member's failover, not at some distant timeout.
TEST(EtcdLaunch, AJobWhoseEtcdLosesItsQuorumStopsWithAnErrorNamingEtcd) {
  cohort::testing::EtcdCluster cluster(3);
  const auto id = fresh_run_id();
  auto argv = std::vector<std::string>{COHORT_CLI_PATH, "run", "--nproc-per-node", "2"};
  for (const auto& flag : etcd_flags(cluster, id, "1")) argv.push_back(flag);
  // The worker runs until it is stopped: the test ends it through etcd's loss.
  for (const auto* arg : {"--", "/bin/sh", "-c", "echo worker $RANK pid $$; exec sleep 600"}) argv.push_back(arg);
  cohort::testing::Subprocess job(argv, {});
  std::smatch m;
  const std::regex started("worker 1 pid (\\d+)");
  ASSERT_TRUE(job.read_until([&](const std::string& out) { return std::regex_search(out, m, started); }, 60s))
      << job.out() << job.err();
  const pid_t worker = std::stoi(m[1]);
  const auto lost_at = std::chrono::steady_clock::now();
  cluster.kill(0);
  cluster.kill(1);
  auto r = job.finish(120s);
  const auto took = std::chrono::duration<double>(std::chrono::steady_clock::now() - lost_at).count();
  ASSERT_FALSE(r.timed_out) << describe(r);
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.err.find("lost the job's etcd (etcd at "), std::string::npos)
      << describe(r);
  EXPECT_NE(r.err.find("Bring back a majority of the etcd members"), std::string::npos) << describe(r);
  EXPECT_TRUE(gone_within(worker, 10s)) << "a worker outlived its agent\n" << describe(r);
  // The heartbeat bound is 6 s (3 x 2 s), a request's failover as long.
  EXPECT_LT(took, 60.0) << describe(r);
}

// Note [An abandoned record in etcd] (found by review): a job of two nodes killed
// whole leaves its record in etcd. A new job under the same id, with other
// settings, used to join it and be refused ("this job runs with --nnodes 2"); now
// its agent finds no heartbeat in the record, deletes the dead job's keys and runs.
TEST(EtcdLaunch, AJobKilledWholeLeavesNothingThatHoldsTheNextJobUnderItsId) {
  cohort::testing::EtcdCluster cluster(3);
  const auto id = fresh_run_id();
  const std::string conf = "join_timeout=60,last_call_timeout=1,keep_alive_interval=1";
  auto agent = [&](const std::string& nnodes, const std::string& script) {
    return std::vector<std::string>{COHORT_CLI_PATH,  "run",    "--nnodes", nnodes, "--rdzv-backend", "etcd",
                                    "--rdzv-endpoint", cluster.endpoint_list(), "--rdzv-id", id, "--rdzv-conf", conf,
                                    "--max-restarts", "3", "--", "/bin/sh", "-c", script};
  };
  const std::string runs = "echo worker $RANK of $WORLD_SIZE pid $$; exec sleep 600";
  cohort::testing::Subprocess a(agent("2", runs), {});
  cohort::testing::Subprocess b(agent("2", runs), {});
  std::smatch m;
  const std::regex started("worker \\d of 2 pid (\\d+)");
  ASSERT_TRUE(a.read_until([&](const std::string& out) { return std::regex_search(out, m, started); }, 60s))
      << a.out() << a.err();
  const pid_t worker_a = std::stoi(m[1]);
  ASSERT_TRUE(b.read_until([&](const std::string& out) { return std::regex_search(out, m, started); }, 60s))
      << b.out() << b.err();
  const pid_t worker_b = std::stoi(m[1]);
  ::kill(a.pid(), SIGKILL);
  ::kill(b.pid(), SIGKILL);
  a.finish(30s);
  b.finish(30s);
  ASSERT_TRUE(gone_within(worker_a, 10s) && gone_within(worker_b, 10s)) << "a worker outlived its agent";
  ASSERT_NE(keys_of(cluster, id), "") << "the killed job left its keys";

  auto r = cohort::testing::run_process(agent("1", "echo worker $RANK of $WORLD_SIZE restart $TORCHELASTIC_RESTART_COUNT"),
                                        120s);
  ASSERT_FALSE(r.timed_out) << describe(r);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.err.find("was a job that no agent runs any more (round 0, 2 node(s) in it"), std::string::npos)
      << describe(r);
  EXPECT_NE(r.out.find("worker 0 of 1 restart 0"), std::string::npos) << describe(r);
  EXPECT_EQ(r.err.find("round 1"), std::string::npos) << "a new job starts at round 0\n" << describe(r);
  EXPECT_EQ(keys_of(cluster, id), "") << describe(r);
}

// Note [The first member that answers] (found by review): the first member listed
// hangs (SIGSTOP: it accepts and answers nothing). Every new client started with
// it and waited out its request_timeout, and the agent's first tries, 2 s each,
// never reached the others: 2 of 3 jobs failed after join_timeout, saying etcd had
// lost its quorum, and the others took 20 s. Now the agent goes on to the next
// member, which then leads every list it and its workers use.
TEST(EtcdLaunch, AFirstMemberThatHangsCostsTheJobOneTryNotItsStart) {
  cohort::testing::EtcdCluster cluster(3);
  cluster.hang(0);
  const auto started = std::chrono::steady_clock::now();
  auto r = cohort::testing::run_process({COHORT_CLI_PATH, "run", "--nproc-per-node", "2", "--rdzv-backend", "etcd",
                                         "--rdzv-endpoint", cluster.endpoint_list(), "--rdzv-id", fresh_run_id(),
                                         "--rdzv-conf", "join_timeout=30,keep_alive_interval=2", "--", "/bin/sh",
                                         "-c", "echo worker $RANK ran"},
                                        120s);
  const auto took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_FALSE(r.timed_out) << describe(r);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("worker 1 ran"), std::string::npos) << describe(r);
  EXPECT_LT(took, 15.0) << "about 3 s here: one 2 s try on the hung member\n" << describe(r);
}

// An etcd that never answers: the agent says so, names the members and the fix,
// within --rdzv-conf join_timeout.
TEST(EtcdLaunch, AnEtcdThatDoesNotAnswerIsNamedWithTheFix) {
  const int port = cohort::testing::free_port();
  auto r = cohort::testing::run_process({COHORT_CLI_PATH, "run", "--rdzv-backend", "etcd", "--rdzv-endpoint",
                                         "127.0.0.1:" + std::to_string(port), "--rdzv-id", fresh_run_id(),
                                         "--rdzv-conf", "join_timeout=3", "--", "/bin/true"},
                                        60s);
  ASSERT_FALSE(r.timed_out) << describe(r);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.err.find("no member of the job's etcd (127.0.0.1:" + std::to_string(port) + ") answered within 3 s"),
            std::string::npos)
      << describe(r);
  EXPECT_NE(r.err.find("endpoint health"), std::string::npos) << describe(r);
}

}  // namespace
