// cohort beside other launchers and programs: the worker binary under Open MPI's
// mpirun (only OMPI_COMM_WORLD_* set) and alone; and a stock PyTorch program, which
// knows only torchrun's contract, under `cohort run`.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "support/subprocess.h"

namespace {
using namespace std::chrono_literals;

TEST(OtherLaunchers, MpirunFormsTheWorld) {
  auto r = cohort::testing::run_process({COHORT_MPIRUN_PATH, "--oversubscribe", "-np", "3", COHORT_TEST_WORKER_PATH,
                                         "collectives"},
                                        120s, {{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_NE(r.out.find("collectives ok rank " + std::to_string(rank) + " world 3 sum 3"), std::string::npos) << r.out;
}

std::vector<std::string> cohort_run_python(const char* script, std::vector<std::string> flags) {
  std::vector<std::string> argv{COHORT_CLI_PATH, "run", "--nproc-per-node", "3", "--stop-timeout", "3"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {COHORT_PYTHON_PATH, script});
  return argv;
}

const std::vector<std::string> kPlainTcpStore{"--rdzv-conf", "worker_store=tcpstore"};

// Note [The workers' store]: stock c10d workers run with a plain TCPStore.
TEST(OtherPrograms, StockPyTorchRunsUnderCohortRunWithAPlainTcpStore) {
  auto r = cohort::testing::run_process(cohort_run_python(COHORT_TORCH_PEER_PATH, kPlainTcpStore), 120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_NE(r.out.find("[rank" + std::to_string(rank) + "]: torch.distributed rank " + std::to_string(rank) +
                         " of 3: 6"),
              std::string::npos)
        << r.out << r.err;
}

// Against cohort's authenticated store (the default, static and elastic), a stock
// worker gets an error, not a crash, and the launcher names it and the fix.
// Note [A stock worker retries]: what the worker does next is PyTorch's: 1.13's
// client fails at the refusal, 2.x's retries until init_process_group's timeout (30
// minutes by default). Note [Telling a stock worker from a port scan]: the launcher
// sees that the refused peer is one of its own workers and ends the job itself,
// exit 2 and no restart, whichever the version; the bound is the proof that it does
// not wait for the worker's own timeout.
TEST(OtherPrograms, StockPyTorchAgainstCohortsStoreEndsTheJobWithTheFix) {
  const std::string fix =
      "only for workers that must stay stock c10d (Python's init_process_group): --rdzv-conf worker_store=tcpstore";
  for (const auto& flags : {std::vector<std::string>{"--max-restarts", "3"},
                            std::vector<std::string>{"--standalone", "--max-restarts", "3"}}) {
    cohort::testing::Subprocess job(cohort_run_python(COHORT_TORCH_PEER_PATH, flags));
    const auto r = job.finish(90s);
    const auto all = r.out + r.err;
    EXPECT_FALSE(r.timed_out) << "the job waited for the worker's own timeout\n" << all;
    EXPECT_EQ(r.signal, 0) << all;
    EXPECT_EQ(r.exit_code, 2) << all;
    EXPECT_NE(all.find("of this job (a worker, or a process it started) reached the rendezvous store from 127.0.0.1:"),
              std::string::npos)
        << all;
    EXPECT_NE(r.err.find(fix), std::string::npos) << all;
    EXPECT_EQ(all.find("restarting every worker"), std::string::npos) << "no restart mends it\n" << all;
    EXPECT_EQ(all.find("restarting the workers of every node"), std::string::npos) << "no restart mends it\n" << all;
    for (const char* crash : {"bad_alloc", "length_error", "SIGABRT", "core dumped"})
      EXPECT_EQ(all.find(crash), std::string::npos) << crash << " in\n" << all;
  }
}

// Stock DDP under the elastic launcher with a plain TCPStore trains exactly as under
// the static launcher.
TEST(OtherPrograms, StockPyTorchDdpUnderTheElasticLauncherEqualsTheStaticLauncher) {
  auto static_run = cohort::testing::run_process(cohort_run_python(COHORT_TORCH_DDP_PEER_PATH, kPlainTcpStore), 180s);
  ASSERT_EQ(static_run.exit_code, 0) << static_run.out << static_run.err;
  auto elastic_flags = kPlainTcpStore;
  elastic_flags.insert(elastic_flags.begin(), "--standalone");
  auto elastic_run = cohort::testing::run_process(cohort_run_python(COHORT_TORCH_DDP_PEER_PATH, elastic_flags), 180s);
  ASSERT_EQ(elastic_run.exit_code, 0) << elastic_run.out << elastic_run.err;
  auto weights = [](const std::string& out) {
    const auto at = out.find("final weights ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  ASSERT_FALSE(weights(static_run.out).empty()) << static_run.out;
  EXPECT_GT(weights(static_run.out).size(), 200u);  // 178 numbers
  EXPECT_EQ(weights(elastic_run.out), weights(static_run.out));
  EXPECT_NE(elastic_run.err.find("worker_store=tcpstore: the workers' c10d TCPStore"), std::string::npos)
      << elastic_run.err;
}

TEST(OtherLaunchers, PlainRunIsAWorldOfOne) {
  auto r = cohort::testing::run_process({COHORT_TEST_WORKER_PATH, "collectives"}, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("collectives ok rank 0 world 1 sum 0"), std::string::npos) << r.out;
}

}  // namespace
