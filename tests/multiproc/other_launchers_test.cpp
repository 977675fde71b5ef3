// cohort beside other launchers and programs: the worker binary under Open MPI's
// mpirun (only OMPI_COMM_WORLD_* set) and alone; and a stock PyTorch program, which
// knows only torchrun's contract, under `cohort run`.
#include <gtest/gtest.h>

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

TEST(OtherPrograms, StockPyTorchRunsUnderCohortRun) {
  auto r = cohort::testing::run_process({COHORT_CLI_PATH, "run", "--nproc-per-node", "3", COHORT_PYTHON_PATH,
                                         COHORT_TORCH_PEER_PATH},
                                        120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_NE(r.out.find("[rank" + std::to_string(rank) + "]: torch.distributed rank " + std::to_string(rank) +
                         " of 3: 6"),
              std::string::npos)
        << r.out << r.err;
}

TEST(OtherLaunchers, PlainRunIsAWorldOfOne) {
  auto r = cohort::testing::run_process({COHORT_TEST_WORKER_PATH, "collectives"}, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("collectives ok rank 0 world 1 sum 0"), std::string::npos) << r.out;
}

}  // namespace
