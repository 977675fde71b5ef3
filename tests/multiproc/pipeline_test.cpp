// Pipelines across real processes, through `cohort run`: every schedule against the
// single-process reference, DP x PP, recomputation, variable shapes, refusals
// (multiproc/pipeline/pipeline_worker.cpp does the training and the comparing).
#include <gtest/gtest.h>

#include <map>
#include <regex>

#include "support/subprocess.h"

namespace {

using cohort::testing::ProcessResult;
using namespace std::chrono_literals;

const std::string kCohort = COHORT_CLI_PATH;
const std::string kWorker = COHORT_PIPELINE_WORKER_PATH;

std::string describe(const ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + (r.timed_out ? " TIMED OUT" : "") + "\n--- stdout\n" + r.out +
         "\n--- stderr\n" + r.err;
}

ProcessResult run(int nproc, std::vector<std::string> args, const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv{kCohort, "run", "--nproc-per-node", std::to_string(nproc), "--stop-timeout", "3",
                                kWorker};
  argv.insert(argv.end(), args.begin(), args.end());
  return cohort::testing::run_process(argv, 180s, env);
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

// Every rank printed "<scenario> ok".
void expect_all_ok(const ProcessResult& r, int nproc, const std::string& scenario) {
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(count(r.out, scenario + " ok"), nproc) << describe(r);
  EXPECT_EQ(count(r.out, "FAILED"), 0) << describe(r);
}

struct Case {
  std::string schedule;
  int stages, microbatches, virtual_stages;
};

class PipelineParity : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineParity, EqualsOneProcessOnTheWholeBatch) {
  const auto& c = GetParam();
  auto r = run(c.stages, {"parity", c.schedule, std::to_string(c.stages), std::to_string(c.microbatches),
                          std::to_string(c.virtual_stages)});
  expect_all_ok(r, c.stages, "parity");
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int s : {2, 4}) {
    for (int m : {1, s, 2 * s}) out.push_back({"gpipe", s, m, 1});
    for (int m : {s, 2 * s}) {
      out.push_back({"1f1b", s, m, 1});
      out.push_back({"interleaved", s, m, 2});
      out.push_back({"zero-bubble", s, m, 1});
    }
  }
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  auto name = info.param.schedule + "_S" + std::to_string(info.param.stages) + "_M" +
              std::to_string(info.param.microbatches);
  return std::regex_replace(name, std::regex("-"), "_");
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineParity, ::testing::ValuesIn(cases()), case_name);

class HybridParity : public ::testing::TestWithParam<std::string> {};

// 4 ranks: 2 data-parallel replicas of a 2-stage pipeline, each stage under DDP.
TEST_P(HybridParity, TwoReplicasOfTwoStagesEqualOneProcess) {
  const int virtual_stages = GetParam() == "interleaved" ? 2 : 1;
  auto r = run(4, {"parity", GetParam(), "2", "4", std::to_string(virtual_stages)});
  expect_all_ok(r, 4, "parity");
}

INSTANTIATE_TEST_SUITE_P(Schedules, HybridParity,
                         ::testing::Values("gpipe", "1f1b", "interleaved", "zero-bubble"),
                         [](const auto& info) { return std::regex_replace(info.param, std::regex("-"), "_"); });

TEST(PipelineRecompute, EqualsTheReferenceUnder1F1B) {
  expect_all_ok(run(2, {"parity", "1f1b", "2", "4", "1", "--recompute"}), 2, "parity");
}

TEST(PipelineRecompute, ZeroBubbleWithRecomputeUnderDataParallel) {
  expect_all_ok(run(4, {"parity", "zero-bubble", "2", "2", "1", "--recompute"}), 4, "parity");
}

TEST(PipelineRecompute, DropoutDrawsTheSameMasks) {
  expect_all_ok(run(2, {"recompute_dropout", "1f1b", "2", "4"}), 2, "recompute_dropout");
}

TEST(PipelineShapes, SequenceLengthsVaryAcrossMicroBatches) {
  expect_all_ok(run(2, {"varlen", "1f1b", "4"}), 2, "varlen");
  expect_all_ok(run(2, {"varlen", "zero-bubble", "3"}), 2, "varlen");
}

TEST(PipelineAutocast, Bf16StagesMatchOneProcessUnderTheSameAutocast) {
  expect_all_ok(run(2, {"autocast"}), 2, "autocast");
}

TEST(PipelineState, AStageWithMoreEntriesThanOneTransferIsAssembled) {
  expect_all_ok(run(2, {"big_state"}), 2, "big_state");
}

TEST(PipelineState, AStageWithoutParametersUnderDataParallel) {
  expect_all_ok(run(4, {"parameterless_stage"}), 4, "parameterless_stage");
}

TEST(PipelineErrors, MismatchedMicroBatchCountsAreRefusedOnEveryRank) {
  auto r = run(2, {"mismatch"});
  expect_all_ok(r, 2, "mismatch");
  EXPECT_NE(r.out.find("disagree"), std::string::npos) << describe(r);
  EXPECT_NE(r.out.find("4 micro-batches"), std::string::npos) << describe(r);
}

TEST(PipelineErrors, OneF1BWithFewerMicroBatchesThanStagesIsRefused) {
  auto r = run(2, {"parity", "1f1b", "2", "1"});
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.err.find("micro-batches"), std::string::npos) << describe(r);
}

TEST(PipelineErrors, AStageWhoseForwardFailsIsNamed) {
  auto r = run(2, {"bad_input"}, {{"COHORT_TIMEOUT", "10"}});
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.err.find("pipeline rank 0 (global rank 0), stage 0, at F0@s0 (forward of micro-batch 0) failed: "),
            std::string::npos)
      << describe(r);
  EXPECT_NE(r.err.find("shapes cannot be multiplied"), std::string::npos) << describe(r);
}

TEST(PipelineErrors, AStageThatStopsAnsweringIsNamedWithinTheTimeout) {
  auto r = run(2, {"hang"}, {{"COHORT_TIMEOUT", "4"}});
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_LT(r.seconds, 60) << describe(r);
  const auto all = r.out + r.err;
  EXPECT_NE(all.find("pipeline rank 0 (global rank 0), stage 0, at RG"), std::string::npos) << describe(r);
  EXPECT_NE(all.find("from stage 1 on global rank 1"), std::string::npos) << describe(r);
  EXPECT_NE(all.find("timed out"), std::string::npos) << describe(r);
}

}  // namespace
