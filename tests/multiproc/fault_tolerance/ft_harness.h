#pragma once
// What tests/multiproc/fault_tolerance_test.cpp and fault_tolerance_zero_test.cpp
// share: launching cohort_ft_worker under `cohort run --fault-tolerance
// in-process`, and the one-process reference run every replica must end equal to.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace cohort::testing::ft {

using namespace std::chrono_literals;

constexpr int kSteps = 24;
constexpr int kReplicas = 3;

inline std::string describe(const ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + (r.timed_out ? " TIMED OUT" : "") + "\n--- stdout\n" + r.out +
         "\n--- stderr\n" + r.err;
}

inline std::map<std::string, std::string> ft_env() {
  return {{"COHORT_FT_COLLECTIVE_TIMEOUT", "3"}, {"COHORT_FT_QUORUM_TIMEOUT", "2"},
          {"COHORT_FT_MIN_REPLICAS_TIMEOUT", "30"}, {"OMP_NUM_THREADS", "1"}};
}

inline std::vector<std::string> launch(const std::string& out, const std::vector<std::string>& args,
                                const std::vector<std::string>& launcher_flags = {}, int nproc = kReplicas) {
  std::vector<std::string> argv{COHORT_CLI_PATH,  "run",       "--nproc-per-node", std::to_string(nproc),
                                "--fault-tolerance", "in-process", "--max-restarts", "3",
                                "--stop-timeout",    "3",          COHORT_FT_WORKER_PATH,
                                "--steps",           std::to_string(kSteps), "--out", out,
                                "--degraded-step-ms", "20", "--hold-last-step"};
  argv.insert(argv.begin() + 2, launcher_flags.begin(), launcher_flags.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

inline std::vector<torch::Tensor> load(const std::string& path) {
  std::vector<torch::Tensor> t;
  torch::load(t, path);
  return t;
}

inline double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

class FaultTolerance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    reference_dir_ = new cohort::testing::TempDir("cohort-ft-ref");
    auto r = cohort::testing::run_process(
        {COHORT_FT_WORKER_PATH, "--reference", "--steps", std::to_string(kSteps), "--out", reference_dir_->path}, 120s);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    reference_ = load(reference_dir_->path + "/reference.pt");
    before_last_ = load(reference_dir_->path + "/reference_before_last.pt");
  }
  static void TearDownTestSuite() { delete reference_dir_; }

  // Every replica's final weights equal the reference's, and the test could tell a
  // step lost or applied twice (the last step alone moves them far more).
  void expect_reference_weights(const std::string& dir, const ProcessResult& r, int ranks = kReplicas) {
    ASSERT_GT(max_diff(reference_, before_last_), 1e-3) << "the last step must move the weights measurably";
    for (int id = 0; id < ranks; ++id) {
      const auto path = dir + "/final_" + std::to_string(id) + ".pt";
      ASSERT_TRUE(std::filesystem::exists(path)) << "replica " << id << " wrote no weights\n" << describe(r);
      EXPECT_LT(max_diff(load(path), reference_), 2e-5) << "replica " << id << "\n" << describe(r);
    }
  }

  // Replicas that never died committed every step exactly once.
  static void expect_survivor_committed_all(const ProcessResult& r, int replica) {
    std::regex done("replica " + std::to_string(replica) + ": done at step (\\d+): committed (\\d+)");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, done)) << describe(r);
    EXPECT_EQ(std::stoi(m[1]), kSteps);
    EXPECT_EQ(std::stoi(m[2]), kSteps) << describe(r);
  }

  static inline cohort::testing::TempDir* reference_dir_ = nullptr;
  static inline std::vector<torch::Tensor> reference_;
  static inline std::vector<torch::Tensor> before_last_;
};

inline ProcessResult run_ft(const std::string& out, const std::vector<std::string>& args,
                            const std::vector<std::string>& launcher_flags = {}, int nproc = kReplicas) {
  return cohort::testing::run_process(launch(out, args, launcher_flags, nproc), 180s, ft_env());
}

// Rank `rank` stops itself (SIGSTOP) in backward at step `at`; once rank 0 trains in
// quorum 2 without it (after the collective and quorum timeouts), it is resumed
// (SIGCONT) and the job runs to its end. Empty, with the failure added, when either
// never showed.
inline std::optional<ProcessResult> run_with_a_stop(const std::string& out, int rank, int at,
                                                    std::vector<std::string> args = {}, int nproc = kReplicas) {
  args.push_back("--stop");
  args.push_back(std::to_string(rank) + ":" + std::to_string(at));
  cohort::testing::Subprocess job(launch(out, args, {}, nproc), ft_env());
  std::smatch m;
  const std::regex stopping("replica " + std::to_string(rank) + ": stopping at step " + std::to_string(at) +
                            " pid (\\d+)");
  if (!job.read_until([&](const std::string& text) { return std::regex_search(text, m, stopping); }, 60s)) {
    ADD_FAILURE() << "rank " << rank << " never stopped\n" << job.out() << job.err();
    return std::nullopt;
  }
  const pid_t pid = std::stoi(m[1]);
  if (!job.read_until([](const std::string& text) { return text.find("replica 0: joined q2") != std::string::npos; },
                      30s)) {
    ADD_FAILURE() << "the others never trained on without it\n" << job.out() << job.err();
    ::kill(pid, SIGCONT);
    return std::nullopt;
  }
  ::kill(pid, SIGCONT);
  return job.finish(180s);
}

}  // namespace cohort::testing::ft
