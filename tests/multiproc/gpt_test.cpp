// The GPT trainer (examples/gpt) as a user runs it, through `cohort run` with two
// processes: it trains, its validation loss falls, it samples text and ends with the
// JSON line; impossible flags stop it with a message that says why.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/subprocess.h"
#include "support/temp_dir.h"

using namespace std::chrono_literals;

namespace {

// A model and run small enough for a few seconds on two cores.
const std::vector<std::string> kTiny = {"--layers", "1",    "--embed-dim", "32",  "--heads",        "2",
                                        "--context", "32",  "--batch-size", "8",  "--steps",        "40",
                                        "--eval-every", "20", "--eval-batches", "2", "--lr",        "1e-2",
                                        "--samples", "1",   "--sample-tokens", "8", "--vocab-size", "512"};

cohort::testing::ProcessResult run_gpt(const std::string& cache, std::vector<std::string> args) {
  std::vector<std::string> argv{COHORT_CLI_PATH, "run", "--nproc-per-node", "2", "--stop-timeout", "3",
                                COHORT_GPT_PATH, "--cache-dir", cache};
  argv.insert(argv.end(), args.begin(), args.end());
  return cohort::testing::run_process(argv, 120s, {{"COHORT_TIMEOUT", "60"}, {"OMP_NUM_THREADS", "1"}});
}

std::string describe(const cohort::testing::ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + (r.timed_out ? " TIMED OUT" : "") + "\n--- stdout\n" + r.out +
         "\n--- stderr\n" + r.err;
}

// Rank 0's last JSON line.
nlohmann::json summary(const std::string& out) {
  const std::string tag = "[rank0]: {";
  const auto at = out.rfind(tag);
  if (at == std::string::npos) return nullptr;
  const auto end = out.find('\n', at);
  return nlohmann::json::parse(out.substr(at + tag.size() - 1, end - at - tag.size() + 1), nullptr, false);
}

void expect_trained(const cohort::testing::ProcessResult& r) {
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const auto j = summary(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_LT(j.at("val_loss").get<double>(), j.at("first_val_loss").get<double>() - 0.3) << r.out;
  EXPECT_EQ(j.at("steps").get<int>(), 40);
  EXPECT_GT(j.at("tokens_per_second").get<double>(), 0);
  EXPECT_NE(r.out.find("[rank0]: sample 1: "), std::string::npos) << r.out;
}

TEST(GptTrainer, TensorParallelTrainsAndSamples) {
  cohort::testing::TempDir cache("cohort-gpt-test");
  const auto r = run_gpt(cache.path, kTiny);
  expect_trained(r);
  const auto j = summary(r.out);
  EXPECT_EQ(j.at("tp").get<int>(), 2);
  EXPECT_EQ(j.at("dp").get<int>(), 1);
  EXPECT_TRUE(j.at("mfu").is_number()) << r.out;
}

TEST(GptTrainer, SequenceParallelWithBf16AndRecompute) {
  cohort::testing::TempDir cache("cohort-gpt-test");
  auto args = kTiny;
  args.insert(args.end(), {"--sequence-parallel", "--amp", "bf16", "--activation-checkpointing", "--dropout", "0.1"});
  expect_trained(run_gpt(cache.path, args));
}

TEST(GptTrainer, ZeroThreeOverTwoReplicas) {
  cohort::testing::TempDir cache("cohort-gpt-test");
  auto args = kTiny;
  args.insert(args.end(), {"--tp", "1", "--zero", "3"});
  const auto r = run_gpt(cache.path, args);
  expect_trained(r);
  EXPECT_EQ(summary(r.out).at("dp").get<int>(), 2);
}

TEST(GptTrainer, PipelineOfTwoStages) {
  cohort::testing::TempDir cache("cohort-gpt-test");
  auto args = kTiny;
  // Two stages need two blocks; four micro-batches of the batch's 8 rows under 1F1B.
  args.at(1) = "2";
  args.insert(args.end(), {"--tp", "1", "--pp", "2", "--microbatches", "4"});
  const auto r = run_gpt(cache.path, args);
  expect_trained(r);
  const auto j = summary(r.out);
  EXPECT_EQ(j.at("pp").get<int>(), 2);
  EXPECT_EQ(j.at("dp").get<int>(), 1);
  EXPECT_EQ(j.at("microbatches").get<int>(), 4);
  EXPECT_EQ(j.at("comm_hook").get<std::string>(), "pipeline");
}

TEST(GptTrainer, ImpossibleFlagsSayWhy) {
  cohort::testing::TempDir cache("cohort-gpt-test");
  auto sharded = run_gpt(cache.path, {"--tp", "1", "--pp", "2", "--zero", "3"});
  EXPECT_NE(sharded.exit_code, 0) << describe(sharded);
  EXPECT_NE((sharded.out + sharded.err).find("--pp 2 --tp 1 --zero 3 cannot run together"), std::string::npos)
      << describe(sharded);
  EXPECT_NE((sharded.out + sharded.err).find("ZeRO-3 cannot shard a pipeline's stages"), std::string::npos)
      << describe(sharded);
  auto heads = run_gpt(cache.path, {"--heads", "3"});
  EXPECT_NE(heads.exit_code, 0) << describe(heads);
  EXPECT_NE((heads.out + heads.err).find("make --heads a multiple of --tp"), std::string::npos) << describe(heads);
}

}  // namespace
