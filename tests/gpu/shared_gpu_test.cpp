// Two processes on one GPU (labelled `gpu`): NCCL refuses two ranks on one device,
// Gloo takes CUDA tensors, so `cohort run --nproc-per-node 2` on a one-GPU machine
// picks Gloo (backend "auto") and each rank keeps its model on cuda:0. Each rank's
// DDP training must equal the single-process reference on the CPU, as the
// multiproc tier's ddp_test.cpp proves on the CPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/subprocess.h"

namespace {
using namespace std::chrono_literals;

TEST(GpuShared, TwoProcessesOnOneGpuOverGlooEqualTheCpuReference) {
  ASSERT_GT(torch::cuda::device_count(), 0) << "a gpu test started without a GPU";
  for (const std::string model : {"mlp", "shared"}) {
    auto r = cohort::testing::run_process({COHORT_CLI_PATH, "run", "--nproc-per-node", "2", "--stop-timeout", "3",
                                           COHORT_DDP_WORKER_PATH, "parity", "--model", model, "--device", "cuda"},
                                          100s, {{"COHORT_TIMEOUT", "60"}});
    const auto described = "exit " + std::to_string(r.exit_code) + (r.timed_out ? " TIMED OUT" : "") +
                           "\n--- stdout\n" + r.out + "\n--- stderr\n" + r.err;
    ASSERT_FALSE(r.timed_out) << described;
    EXPECT_EQ(r.exit_code, 0) << described;
    for (int rank = 0; rank < 2; ++rank) {
      const auto line = "[rank" + std::to_string(rank) + "]: parity " + model + " ok rank " + std::to_string(rank) +
                        " world 2";
      EXPECT_NE(r.out.find(line), std::string::npos) << "missing: " << line << "\n" << described;
    }
  }
}

}  // namespace
