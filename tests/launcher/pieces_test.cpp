// The launcher's pure pieces: worker environment, line splitting, rank assignment,
// failure summaries.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include "cohort/launcher/failure.h"
#include "cohort/launcher/line_splitter.h"
#include "cohort/launcher/static_rendezvous.h"
#include "cohort/launcher/worker_env.h"

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

TEST(WorkerEnv, KeepsTheUsersThreadCountAndOneWorkerAlone) {
  RunOptions o;
  WorkerSlot many{0, 0, 2, 2, 0, 1};
  EXPECT_EQ(worker_environment({{"OMP_NUM_THREADS", "4"}}, o, many, {}, "e")["OMP_NUM_THREADS"], "4");
  WorkerSlot one{0, 0, 1, 1, 0, 1};
  EXPECT_EQ(worker_environment({}, o, one, {}, "e").count("OMP_NUM_THREADS"), 0u);
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
  auto root = root_cause({casualty, culprit});
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

TEST(Failure, MessageComesFromTheErrorFile) {
  auto w = outcome(1, 1 << 8, false);
  w.error = cohort::elastic::ErrorRecord{"std::runtime_error: boom", "", 0};
  w.error_file = "/x/error.json";
  auto text = failure_summary({w}, {"h", "r", 0, 0});
  EXPECT_NE(text.find("message: std::runtime_error: boom"), std::string::npos) << text;
  EXPECT_NE(text.find("error file: /x/error.json"), std::string::npos) << text;
}

}  // namespace
