// Tensor parallelism composed with the other strategies, in real processes through
// `cohort run` (multiproc/tensor_parallel/gpt_parity_worker.cpp): examples/gpt's
// model on a device mesh, trained 5 steps in fp32, has the losses and the weights of
// the same model trained in one process on the whole global batch, within 1e-5
// (under bf16 autocast, within bf16's precision).
// Every rank checks its own slices and says so.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/subprocess.h"

namespace {

using namespace std::chrono_literals;

void expect_every_rank_ok(const std::string& label, int world, std::vector<std::string> flags) {
  std::vector<std::string> command{COHORT_CLI_PATH, "run", "--nproc-per-node", std::to_string(world),
                                   "--stop-timeout", "3", COHORT_GPT_PARITY_WORKER_PATH, label};
  command.insert(command.end(), flags.begin(), flags.end());
  auto r = cohort::testing::run_process(command, 120s, {{"COHORT_TIMEOUT", "60"}});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < world; ++rank)
    EXPECT_NE(r.out.find("gpt " + label + " ok rank " + std::to_string(rank) + " "), std::string::npos)
        << r.out << r.err;
}

// One rank per process on 2 cores: 8 processes of a model this small still take a
// few seconds.
TEST(TensorParallelGpt, Tp2WithDropoutEqualsOneProcess) {
  expect_every_rank_ok("tp2", 2, {"--tp", "2", "--dropout", "0.1"});
}
TEST(TensorParallelGpt, Tp2SequenceParallelWithDropout) {
  expect_every_rank_ok("tp2_sp", 2, {"--tp", "2", "--sp", "--dropout", "0.1"});
}
TEST(TensorParallelGpt, Tp2SequenceParallelAdamW) {
  expect_every_rank_ok("tp2_adamw", 2, {"--tp", "2", "--sp", "--optimizer", "adamw"});
}
// Activation checkpointing per block: backward replays the block's collectives and
// its dropout masks.
TEST(TensorParallelGpt, Tp2SequenceParallelCheckpointedBlocksWithDropout) {
  expect_every_rank_ok("tp2_sp_recompute", 2, {"--tp", "2", "--sp", "--dropout", "0.1", "--recompute"});
}
// bf16 autocast on both sides: equal within bf16's precision (the worker's --amp).
TEST(TensorParallelGpt, Dp2Tp2SequenceParallelBf16Autocast) {
  expect_every_rank_ok("dp2_tp2_amp", 4, {"--dp", "2", "--tp", "2", "--strategy", "ddp", "--sp", "--amp"});
}
TEST(TensorParallelGpt, Tp2Pp2Bf16Autocast) {
  expect_every_rank_ok("tp2_pp2_amp", 4, {"--pp", "2", "--tp", "2", "--layers", "4", "--amp"});
}
TEST(TensorParallelGpt, Dp2Tp2Ddp) {
  expect_every_rank_ok("dp2_tp2", 4, {"--dp", "2", "--tp", "2", "--strategy", "ddp"});
}
TEST(TensorParallelGpt, Dp2Tp2DdpSequenceParallel) {
  expect_every_rank_ok("dp2_tp2_sp", 4, {"--dp", "2", "--tp", "2", "--strategy", "ddp", "--sp"});
}
TEST(TensorParallelGpt, Dp2Tp2Zero1) {
  expect_every_rank_ok("dp2_tp2_zero1", 4, {"--dp", "2", "--tp", "2", "--strategy", "zero1", "--sp"});
}
TEST(TensorParallelGpt, Dp2Tp2Zero2) {
  expect_every_rank_ok("dp2_tp2_zero2", 4, {"--dp", "2", "--tp", "2", "--strategy", "zero2", "--sp"});
}
TEST(TensorParallelGpt, Dp2Tp2Zero3) {
  expect_every_rank_ok("dp2_tp2_zero3", 4, {"--dp", "2", "--tp", "2", "--strategy", "zero3"});
}
TEST(TensorParallelGpt, Tp2Pp2TiedEmbeddings) {
  expect_every_rank_ok("tp2_pp2", 4, {"--pp", "2", "--tp", "2", "--layers", "4"});
}
TEST(TensorParallelGpt, Tp2Pp2SequenceParallelRecompute) {
  expect_every_rank_ok("tp2_pp2_sp", 4, {"--pp", "2", "--tp", "2", "--layers", "4", "--sp", "--recompute"});
}

TEST(TensorParallelGpt, Dp2Tp2Pp2DdpSequenceParallel) {
  expect_every_rank_ok("dp2_tp2_pp2", 8,
                       {"--dp", "2", "--pp", "2", "--tp", "2", "--layers", "4", "--strategy", "ddp", "--sp"});
}
TEST(TensorParallelGpt, Dp2Tp2Pp2Zero1) {
  expect_every_rank_ok("dp2_tp2_pp2_zero1", 8,
                       {"--dp", "2", "--pp", "2", "--tp", "2", "--layers", "4", "--strategy", "zero1"});
}

// check_composition refuses on every rank before anything is built, naming the
// combination and the alternative.
TEST(TensorParallelGpt, RefusesZero3WithAPipeline) {
  auto r = cohort::testing::run_process({COHORT_CLI_PATH, "run", "--nproc-per-node", "4", "--stop-timeout", "3",
                                         COHORT_GPT_PARITY_WORKER_PATH, "pp2_zero3", "--dp", "2", "--pp", "2",
                                         "--tp", "1", "--strategy", "zero3"},
                                        120s, {{"COHORT_TIMEOUT", "60"}});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(r.out.find("gpt pp2_zero3 refused rank " + std::to_string(rank) +
                         ": cohort: dp 2 x pp 2 x tp 1 with ZeRO-3 is not supported"),
              std::string::npos)
        << r.out << r.err;
  EXPECT_NE(r.out.find("use ZeRO-1 or DDP over the data dimension with a pipeline"), std::string::npos) << r.out;
}

}  // namespace
