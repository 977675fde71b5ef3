// GradScaler's agreement across ranks, through `cohort run` (multiproc/amp/amp_worker.cpp):
// an overflow on one rank makes every rank skip the step and back off the scale.
#include <gtest/gtest.h>

#include "support/subprocess.h"

namespace {

using namespace std::chrono_literals;

std::string describe(const cohort::testing::ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + (r.timed_out ? " TIMED OUT" : "") + "\n--- stdout\n" + r.out +
         "\n--- stderr\n" + r.err;
}

void expect_both_ranks_ok(const std::string& variant) {
  auto r = cohort::testing::run_process({COHORT_CLI_PATH, "run", "--nproc-per-node", "2", "--stop-timeout", "3",
                                         COHORT_AMP_WORKER_PATH, variant},
                                        120s, {{"COHORT_TIMEOUT", "30"}});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (const char* rank : {"rank 0", "rank 1"})
    EXPECT_NE(r.out.find("amp " + variant + " ok " + rank), std::string::npos) << describe(r);
}

TEST(GradScalerAcrossRanks, AnInfOnOneRankSkipsTheStepOnEvery) { expect_both_ranks_ok("plain"); }
TEST(GradScalerAcrossRanks, WithNoSyncAccumulation) { expect_both_ranks_ok("no_sync"); }
TEST(GradScalerAcrossRanks, WithTheFp16CompressionHook) { expect_both_ranks_ok("fp16_hook"); }

}  // namespace
