// What cohort::cuda_graphs refuses before any capture, on the CPU: a step off CUDA,
// and each DDP setting a replay cannot honour, named with its fix (Note [DDP inside
// a CUDA graph] in ddp/step_end.cpp). The capture itself needs a GPU: tests/gpu.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/cuda_graphs/captured_step.h"
#include "cohort/ddp/comm_hook.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "support/thread_world.h"

namespace {

using cohort::cuda_graphs::CapturedStep;
using cohort::cuda_graphs::CapturedStepOptions;
using cohort::ddp::DistributedDataParallelOptions;

TEST(CapturedStep, AStepOffCudaIsRefusedWithTheFix) {
  try {
    CapturedStep step([] { return at::Tensor(); }, CapturedStepOptions(torch::kCPU));
    FAIL() << "a CPU step was accepted";
  } catch (const cohort::ConfigError& e) {
    const std::string what = e.what();
#ifdef COHORT_HAVE_NCCL
    EXPECT_NE(what.find("the step runs on cpu; fix: run on a GPU"), std::string::npos) << what;
#else
    EXPECT_NE(what.find("this LibTorch has no CUDA"), std::string::npos) << what;
#endif
  }
}

// One step through `ddp` on a tiny batch: forward, backward.
template <class Ddp>
void one_step(Ddp& ddp) {
  auto loss = ddp(torch::ones({2, 4})).sum();
  loss.backward();
}

TEST(CapturedStep, NamesEachDdpSettingAReplayCannotHonour) {
  cohort::testing::run_thread_world(1, [](cohort::comm::World& world) {
    auto why = [&](DistributedDataParallelOptions options, int steps, bool with_buffer = false) {
      torch::manual_seed(0);
      auto net = with_buffer ? torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3))
                             : torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::Linear(3, 2));
      cohort::ddp::DistributedDataParallel ddp(net, world.group(), options);
      for (int s = 0; s < steps; ++s) one_step(ddp);
      return cohort::cuda_graphs::why_not_capturable(ddp);
    };
    const auto plain = DistributedDataParallelOptions();
    EXPECT_NE(why(plain, 0).find("its buckets are not rebuilt yet"), std::string::npos);
    EXPECT_NE(why(plain, 1).find("fix: run at least two steps eagerly first"), std::string::npos);
    // Rebuilt after two steps: on this Gloo world, only the backend is left.
    EXPECT_NE(why(plain, 2).find("its group runs gloo, and only NCCL's collectives can be captured"), std::string::npos)
        << why(plain, 2);
    EXPECT_NE(why(DistributedDataParallelOptions().find_unused_parameters(true), 2)
                  .find("find_unused_parameters and static_graph"),
              std::string::npos);
    EXPECT_NE(why(DistributedDataParallelOptions().static_graph(true), 2).find("turn both off"), std::string::npos);
    EXPECT_NE(why(DistributedDataParallelOptions().comm_hook(cohort::ddp::fp16_compress_hook()), 2)
                  .find("its comm hook 'fp16_compress' may keep host state"),
              std::string::npos)
        << why(DistributedDataParallelOptions().comm_hook(cohort::ddp::fp16_compress_hook()), 2);
    EXPECT_NE(why(DistributedDataParallelOptions().record_timings(true), 2).find("record_timings"), std::string::npos);
    EXPECT_NE(why(plain, 2, /*with_buffer=*/true).find("broadcast_buffers(false)"), std::string::npos);
    EXPECT_NE(why(DistributedDataParallelOptions().broadcast_buffers(false), 2, true).find("its group runs gloo"),
              std::string::npos);
  });
}

}  // namespace
