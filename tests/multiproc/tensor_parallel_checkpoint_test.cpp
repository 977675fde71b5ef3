// Checkpoints of a tensor-parallel model in real processes through `cohort run`
// (multiproc/tensor_parallel/tp_checkpoint_worker.cpp): saved at world 2 as TP 2,
// resumed at world 2 as DP 2 x TP 1 and at world 1, each equal to the uninterrupted
// run; model.pt and `cohort checkpoint consolidate`'s file load in PyTorch with
// whole-shaped tensors.
#include <gtest/gtest.h>

#include <string>

#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace {

using namespace std::chrono_literals;

cohort::testing::ProcessResult run_worker(int nproc, const std::string& phase, const std::string& dir, int tp) {
  return cohort::testing::run_process({COHORT_CLI_PATH, "run", "--nproc-per-node", std::to_string(nproc),
                                       "--stop-timeout", "3", COHORT_TP_CHECKPOINT_WORKER_PATH, phase, dir,
                                       std::to_string(tp)},
                                      120s, {{"COHORT_TIMEOUT", "30"}});
}

// Every rank of the resumed run printed its ok line.
void expect_resumed(const std::string& dir, int nproc, int tp) {
  const auto r = run_worker(nproc, "resume", dir, tp);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < nproc; ++rank)
    EXPECT_NE(r.out.find("tp-checkpoint resume ok rank " + std::to_string(rank) + " world " + std::to_string(nproc)),
              std::string::npos)
        << r.out << r.err;
  std::cout << r.out;
}

TEST(TensorParallelCheckpointProcesses, SavedAtTp2ResumesAtDp2AndAtOneProcessAsTheUninterruptedRun) {
  cohort::testing::TempDir temp("cohort-tp-ckpt");
  const std::string dir = temp.path + "/ckpt";
  const auto saved = run_worker(2, "save", dir, 2);
  ASSERT_FALSE(saved.timed_out) << saved.out << saved.err;
  ASSERT_EQ(saved.exit_code, 0) << saved.out << saved.err;
  expect_resumed(dir, 2, 1);  // DP 2 x TP 1
  expect_resumed(dir, 1, 1);  // one process
  expect_resumed(dir, 2, 2);  // as it was saved

#ifdef COHORT_PYTHON_PATH
  const std::string consolidated = temp.path + "/consolidated.pt";
  const auto c = cohort::testing::run_process({COHORT_CLI_PATH, "checkpoint", "consolidate", dir, consolidated}, 60s);
  ASSERT_EQ(c.exit_code, 0) << c.out << c.err;
  // PyTorch reads both files; the split parameters and their Adam moments are whole.
  const std::string check = R"(
import sys, torch
model = torch.load(sys.argv[1], weights_only=True)
state = torch.load(sys.argv[2], weights_only=True)
whole = {"embed.weight": (16, 8), "block.fc1.weight": (32, 8), "block.fc1.bias": (32,),
         "block.fc2.weight": (8, 32), "block.attention.query.weight": (8, 8)}
for name, shape in whole.items():
    assert tuple(model[name].shape) == shape, (name, model[name].shape)
names = list(model)
assert list(state["model"]) == names
for name in names:
    assert torch.equal(state["model"][name], model[name]), name
i = names.index("block.fc1.weight")
assert tuple(state["optimizer"]["state"][i]["exp_avg"].shape) == (32, 8)
assert state["step"] == 3
print("python ok", len(names), "tensors")
)";
  const auto py = cohort::testing::run_process(
      {COHORT_PYTHON_PATH, "-c", check, dir + "/step-000000003/model.pt", consolidated}, 120s);
  EXPECT_EQ(py.exit_code, 0) << py.out << py.err;
  EXPECT_NE(py.out.find("python ok"), std::string::npos) << py.out << py.err;
  std::cout << py.out;
#else
  GTEST_SKIP() << "no python3 with torch at configure time: model.pt was not read by PyTorch";
#endif
}

}  // namespace
