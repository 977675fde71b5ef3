// Activation checkpointing under DDP at world 2, through `cohort run`
// (multiproc/recompute/recompute_worker.cpp): the weights equal one process training
// without checkpointing.
#include <gtest/gtest.h>

#include "support/subprocess.h"

namespace {

using namespace std::chrono_literals;

void expect_both_ranks_ok(const std::string& variant) {
  auto r = cohort::testing::run_process({COHORT_CLI_PATH, "run", "--nproc-per-node", "2", "--stop-timeout", "3",
                                         COHORT_RECOMPUTE_WORKER_PATH, variant},
                                        120s, {{"COHORT_TIMEOUT", "30"}});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* rank : {"rank 0", "rank 1"})
    EXPECT_NE(r.out.find("recompute " + variant + " ok " + rank), std::string::npos) << r.out << r.err;
}

TEST(CheckpointUnderDdp, SequentialEqualsTrainingWithoutIt) { expect_both_ranks_ok("sequential"); }
TEST(CheckpointUnderDdp, WithFindUnusedParameters) { expect_both_ranks_ok("sequential_unused"); }
TEST(CheckpointUnderDdp, OneCheckpointedFunctionWithItsModules) { expect_both_ranks_ok("function"); }

}  // namespace
