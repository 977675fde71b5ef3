// DistributedDataParallel across real processes through `cohort run`: gradients
// and weights equal a single process fed the whole batch (worlds 2 and 4), and
// misuse is reported on every rank without a hang.
#include <gtest/gtest.h>

#include "support/subprocess.h"

namespace {

using namespace std::chrono_literals;

struct Case {
  std::string name;
  std::vector<std::string> args;
  std::string expect;  // printed by every rank on success
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

cohort::testing::ProcessResult run_ddp(int nproc, const std::vector<std::string>& args) {
  std::vector<std::string> argv{COHORT_CLI_PATH, "run", "--nproc-per-node", std::to_string(nproc), "--stop-timeout",
                                "3", COHORT_DDP_WORKER_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  // A generous bound: the worker's own collectives time out much sooner.
  return cohort::testing::run_process(argv, 240s, {{"COHORT_TIMEOUT", "60"}});
}

std::string describe(const cohort::testing::ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + (r.timed_out ? " TIMED OUT" : "") + "\n--- stdout\n" + r.out +
         "\n--- stderr\n" + r.err;
}

void expect_every_rank(int nproc, const Case& c) {
  auto r = run_ddp(nproc, c.args);
  ASSERT_FALSE(r.timed_out) << describe(r);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (int rank = 0; rank < nproc; ++rank) {
    auto line = "[rank" + std::to_string(rank) + "]: " + c.expect + " ok rank " + std::to_string(rank);
    EXPECT_NE(r.out.find(line), std::string::npos) << "missing: " << line << "\n" << describe(r);
  }
}

class DdpParity : public ::testing::TestWithParam<std::tuple<int, Case>> {};

TEST_P(DdpParity, EveryRankMatchesTheSingleProcessReference) {
  expect_every_rank(std::get<0>(GetParam()), std::get<1>(GetParam()));
}

const Case kCases[] = {
    {"mlp", {"parity", "--model", "mlp"}, "parity mlp"},
    {"mlp_bucket_view", {"parity", "--model", "mlp", "--view"}, "parity mlp"},
    {"mlp_caps_below_one_parameter", {"parity", "--model", "mlp", "--cap", "1", "--first-cap", "1"}, "parity mlp"},
    {"mlp_small_caps", {"parity", "--model", "mlp", "--cap", "2048", "--first-cap", "300"}, "parity mlp"},
    {"shared_parameter", {"parity", "--model", "shared"}, "parity shared"},
    {"shared_parameter_view", {"parity", "--model", "shared", "--view", "--cap", "600"}, "parity shared"},
    {"unused_find_unused", {"parity", "--model", "unused", "--find-unused", "--cap", "1000"}, "parity unused"},
    {"unused_find_unused_view", {"parity", "--model", "unused", "--find-unused", "--view"}, "parity unused"},
    {"unused_static_graph", {"parity", "--model", "unused_static", "--static", "--cap", "1000"},
     "parity unused_static"},
    {"cnn_syncbn", {"parity", "--model", "cnn_syncbn", "--steps", "3"}, "parity cnn_syncbn"},
    {"no_sync", {"no_sync", "--micro-steps", "3", "--steps", "3"}, "no_sync"},
    {"hook_fp16", {"hook", "--hook", "fp16"}, "hook fp16"},
    {"hook_bf16", {"hook", "--hook", "bf16"}, "hook bf16"},
    {"hook_user", {"hook", "--hook", "counting", "--cap", "1000"}, "hook counting"},
    {"join_divide_by_world", {"join"}, "join"},
    {"join_divide_by_active", {"join", "--divide-by-active", "--cap", "1000"}, "join"},
    // Note [A step that failed]: every rank's backward throws in one step, skewed.
    {"failed_step", {"failed_step", "--cap", "1000", "--first-cap", "300"}, "failed_step"},
    {"failed_step_view", {"failed_step", "--view", "--cap", "2048", "--first-cap", "300"}, "failed_step"},
};

INSTANTIATE_TEST_SUITE_P(Worlds, DdpParity, ::testing::Combine(::testing::Values(2, 4), ::testing::ValuesIn(kCases)),
                         [](const auto& info) {
                           return std::get<1>(info.param).name + "_world" + std::to_string(std::get<0>(info.param));
                         });

// Misuse: every rank reports the error, and the run ends instead of hanging.
struct ErrorCase {
  std::string name;
  int nproc;
  std::string scenario;
  std::vector<std::string> expected;  // in every rank's line
};

std::ostream& operator<<(std::ostream& os, const ErrorCase& c) { return os << c.name; }

class DdpErrors : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(DdpErrors, EveryRankReportsTheProblemWithoutAHang) {
  const auto& c = GetParam();
  auto r = run_ddp(c.nproc, {c.scenario});
  ASSERT_FALSE(r.timed_out) << describe(r);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (int rank = 0; rank < c.nproc; ++rank) {
    auto prefix = "[rank" + std::to_string(rank) + "]: " + c.scenario + " ok rank " + std::to_string(rank) + " caught:";
    auto at = r.out.find(prefix);
    ASSERT_NE(at, std::string::npos) << describe(r);
    auto line = r.out.substr(at, r.out.find('\n', at) - at);
    for (const auto& expected : c.expected) EXPECT_NE(line.find(expected), std::string::npos) << expected << " in " << line;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Misuse, DdpErrors,
    ::testing::Values(
        // The first differing parameter, and the rank that differs.
        ErrorCase{"models_differ_across_ranks", 3, "mismatch", {"1.weight", "rank 1"}},
        ErrorCase{"parameters_without_gradient", 2, "unused_error", {"never.weight", "find_unused_parameters(true)"}},
        ErrorCase{"input_on_another_device", 2, "device", {"is on meta", "are on cpu"}}),
    [](const auto& info) { return info.param.name; });

}  // namespace
