// ZeRO-3 (zero::fully_shard) across real processes through `cohort run`: within float
// rounding of DDP at worlds 2, 3 and 4 (uneven flats, a layer used twice, a
// parameter shared by two units, a frozen one), with about 1/N of the parameters,
// gradients and optimizer state per rank; a checkpoint saved at world 4 resumes at
// worlds 2 and 3, fully sharded and under DDP; mismatched options are refused on
// every rank. The scenarios are in multiproc/zero/fully_shard_worker.cpp.
#include <gtest/gtest.h>

#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace {

using namespace std::chrono_literals;

std::string describe(const cohort::testing::ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + (r.timed_out ? " TIMED OUT" : "") + "\n--- stdout\n" + r.out +
         "\n--- stderr\n" + r.err;
}

void expect_every_rank(int nproc, const std::vector<std::string>& args, const std::string& scenario) {
  std::vector<std::string> argv{COHORT_CLI_PATH, "run", "--nproc-per-node", std::to_string(nproc), "--stop-timeout",
                                "3", COHORT_FULLY_SHARD_WORKER_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = cohort::testing::run_process(argv, 240s, {{"COHORT_TIMEOUT", "60"}});
  ASSERT_FALSE(r.timed_out) << describe(r);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (int rank = 0; rank < nproc; ++rank) {
    auto line = "[rank" + std::to_string(rank) + "]: " + scenario + " ok rank " + std::to_string(rank);
    EXPECT_NE(r.out.find(line), std::string::npos) << "missing: " << line << "\n" << describe(r);
  }
}

class FullyShardParity : public ::testing::TestWithParam<std::tuple<int, std::string, bool>> {};

TEST_P(FullyShardParity, WithinFloatRoundingOfDdpHoldingOneNthOfEverything) {
  const auto [world, optimizer, reshard] = GetParam();
  expect_every_rank(world, {"parity", "--optimizer", optimizer, "--steps", "4", "--reshard", reshard ? "1" : "0"},
                    "parity");
}

INSTANTIATE_TEST_SUITE_P(Worlds, FullyShardParity,
                         ::testing::Values(std::make_tuple(2, "sgd", true), std::make_tuple(3, "adam", true),
                                           std::make_tuple(4, "sgd", true), std::make_tuple(3, "sgd", false)),
                         [](const auto& info) {
                           return std::get<1>(info.param) + "_world" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<2>(info.param) ? "" : "_keep_gathered");
                         });

TEST(FullyShard, ACheckpointSavedAtWorld4ResumesAtWorlds2And3ShardedAndUnderDdp) {
  cohort::testing::TempDir dir;
  const auto ckpt = dir.path + "/ckpt";
  expect_every_rank(4, {"parity", "--optimizer", "adam", "--steps", "3", "--dir", ckpt}, "parity");
  for (int world : {2, 3}) expect_every_rank(world, {"resume", "--optimizer", "adam", "--steps", "3", "--dir", ckpt},
                                             "resume");
}

TEST(FullyShard, MismatchedOptionsAreRefusedOnEveryRank) { expect_every_rank(3, {"mismatch"}, "mismatch"); }

}  // namespace
