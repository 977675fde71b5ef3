// ZeRO-1 (zero::ShardedOptimizer) across real processes through `cohort run`:
// bitwise equal to DDP with the same optimizer at worlds 2, 3 and 4 (uneven
// partitions), about 1/N of the optimizer's state per rank, a gathered state that
// loads into a plain optimizer and resumes at other world sizes, agreement with a
// GradScaler, and a mismatch refused on every rank.
#include <gtest/gtest.h>

#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace {

using namespace std::chrono_literals;

cohort::testing::ProcessResult run_zero(int nproc, const std::vector<std::string>& args) {
  std::vector<std::string> argv{COHORT_CLI_PATH, "run", "--nproc-per-node", std::to_string(nproc), "--stop-timeout",
                                "3", COHORT_ZERO_WORKER_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return cohort::testing::run_process(argv, 240s, {{"COHORT_TIMEOUT", "60"}});
}

std::string describe(const cohort::testing::ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + (r.timed_out ? " TIMED OUT" : "") + "\n--- stdout\n" + r.out +
         "\n--- stderr\n" + r.err;
}

void expect_every_rank(int nproc, const std::vector<std::string>& args, const std::string& scenario) {
  auto r = run_zero(nproc, args);
  ASSERT_FALSE(r.timed_out) << describe(r);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (int rank = 0; rank < nproc; ++rank) {
    auto line = "[rank" + std::to_string(rank) + "]: " + scenario + " ok rank " + std::to_string(rank);
    EXPECT_NE(r.out.find(line), std::string::npos) << "missing: " << line << "\n" << describe(r);
  }
}

class ZeroParity : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(ZeroParity, BitwiseEqualToDdpWithTheWholeOptimizer) {
  const auto [world, optimizer] = GetParam();
  expect_every_rank(world, {"parity", "--optimizer", optimizer, "--steps", "4"}, "parity");
}

INSTANTIATE_TEST_SUITE_P(Worlds, ZeroParity,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values("sgd", "adam")),
                         [](const auto& info) {
                           return std::get<1>(info.param) + "_world" + std::to_string(std::get<0>(info.param));
                         });

// Buckets of at most 1000 bytes: most parameters travel alone, the small ones together.
TEST(Zero, SmallBucketsChangeNothing) {
  expect_every_rank(3, {"parity", "--optimizer", "adamw", "--cap", "1000"}, "parity");
}

// Saved whole at world 4, resumed at worlds 2 and 3.
TEST(Zero, AStateGatheredAtWorld4ResumesAtWorlds2And3) {
  cohort::testing::TempDir dir;
  const auto file = dir.path + "/optimizer.pt";
  expect_every_rank(4, {"parity", "--optimizer", "adam", "--save", "--file", file}, "parity");
  for (int world : {2, 3}) expect_every_rank(world, {"resume", "--optimizer", "adam", "--file", file}, "resume");
}

TEST(Zero, EveryRankSkipsTheStepInWhichOneRankOverflowed) {
  expect_every_rank(3, {"amp", "--optimizer", "adam", "--steps", "5"}, "amp");
}

// Rank 1 differs (its bucket size, its learning rate, or it has no factory): every
// rank refuses in the constructor's replica check, with the difference, and none hangs.
TEST(Zero, MismatchedSettingsAreRefusedOnEveryRank) {
  for (const auto& [what, expect] : std::vector<std::pair<std::string, std::string>>{
           {"cap", "ShardedOptimizerOptions::bucket_cap_bytes"},
           {"lr", "the optimizer's settings"},
           {"factory", "the optimizer's settings"},
           {"stage", "ShardedOptimizerOptions::shard_gradients"}}) {
    auto r = run_zero(3, {"mismatch", "--optimizer", "adam", "--file", what});
    ASSERT_FALSE(r.timed_out) << describe(r);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    for (int rank = 0; rank < 3; ++rank)
      EXPECT_NE(r.out.find("[rank" + std::to_string(rank) + "]: mismatch ok rank " + std::to_string(rank)),
                std::string::npos)
          << describe(r);
    EXPECT_NE(r.out.find(expect), std::string::npos) << what << "\n" << describe(r);
    EXPECT_NE(r.out.find("differ from rank 0: 1"), std::string::npos) << what << "\n" << describe(r);
  }
}

// ZeRO-2 (shard_gradients, Note [ZeRO-2 gradients]): the sharded copy is not under
// DDP; within float rounding of DDP with the whole optimizer, and each rank holds
// only its own parameters' gradients (checked in the worker).
class ZeroTwoParity : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(ZeroTwoParity, WithinFloatRoundingOfDdpHoldingOnlyItsOwnGradients) {
  const auto [world, optimizer] = GetParam();
  expect_every_rank(world, {"parity", "--stage", "2", "--optimizer", optimizer, "--steps", "4"}, "parity");
}

INSTANTIATE_TEST_SUITE_P(Worlds, ZeroTwoParity,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values("sgd", "adam")),
                         [](const auto& info) {
                           return std::get<1>(info.param) + "_world" + std::to_string(std::get<0>(info.param));
                         });

TEST(ZeroTwo, SmallBucketsAccumulationAndAmpAgreeWithDdp) {
  expect_every_rank(3, {"parity", "--stage", "2", "--optimizer", "adamw", "--cap", "1000"}, "parity");
  expect_every_rank(3, {"accumulate", "--stage", "2", "--optimizer", "sgd", "--steps", "3"}, "accumulate");
  expect_every_rank(3, {"amp", "--stage", "2", "--optimizer", "adam", "--steps", "5"}, "amp");
}

// Gathered at world 4 with stage 2, resumed at worlds 2 and 3 (the state's format is
// stage 1's: the stage decides where gradients live, not what is saved).
TEST(ZeroTwo, AStateGatheredAtWorld4ResumesAtWorlds2And3) {
  cohort::testing::TempDir dir;
  const auto file = dir.path + "/optimizer.pt";
  expect_every_rank(4, {"parity", "--stage", "2", "--optimizer", "adam", "--save", "--file", file}, "parity");
  for (int world : {2, 3})
    expect_every_rank(world, {"resume", "--stage", "2", "--optimizer", "adam", "--file", file}, "resume");
}

}  // namespace
