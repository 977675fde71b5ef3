// Tensor parallelism in real processes through `cohort run`
// (multiproc/tensor_parallel/tp_worker.cpp): a transformer block with dropout split
// over two processes equals the same block in one process, step after step.
#include <gtest/gtest.h>

#include "support/subprocess.h"

namespace {

using namespace std::chrono_literals;

void expect_both_ranks_ok(const std::string& variant) {
  auto r = cohort::testing::run_process({COHORT_CLI_PATH, "run", "--nproc-per-node", "2", "--stop-timeout", "3",
                                         COHORT_TP_WORKER_PATH, variant},
                                        120s, {{"COHORT_TIMEOUT", "30"}});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* rank : {"rank 0", "rank 1"})
    EXPECT_NE(r.out.find("tp " + variant + " ok " + rank), std::string::npos) << r.out << r.err;
}

TEST(TensorParallelProcesses, ABlockWithDropoutEqualsOneProcess) { expect_both_ranks_ok("plain"); }
TEST(TensorParallelProcesses, WithSequenceParallelism) { expect_both_ranks_ok("sequence_parallel"); }

}  // namespace
