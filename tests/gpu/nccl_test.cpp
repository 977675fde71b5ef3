// NCCL on one GPU (labelled `gpu`, like gpu_test.cpp): a world of one over an
// in-memory store, so no launcher and no network. It proves that cohort's NCCL
// backend starts against the NCCL torch loads, and that DDP's step on CUDA over NCCL
// computes what a single process computes on the CPU.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "cohort/comm/world.h"
#include "cohort/ddp/distributed_data_parallel.h"

namespace {
using namespace std::chrono_literals;

cohort::comm::World nccl_world_of_one() {
  return cohort::comm::World::init_with_store(c10::make_intrusive<c10d::HashStore>(), 0, 1,
                                              cohort::comm::InitOptions().backend("nccl").timeout(60s));
}

TEST(GpuNccl, WorldOfOneAllReducesOnTheGpu) {
  ASSERT_GT(torch::cuda::device_count(), 0) << "a gpu test started without a GPU";
  auto world = nccl_world_of_one();
  EXPECT_EQ(world.backend_name(), "nccl");
  EXPECT_EQ(world.device(), c10::Device(c10::kCUDA, 0));
  auto expected = torch::arange(1000, torch::kDouble);
  auto sum = expected.to(torch::kCUDA);
  world.group().all_reduce(sum);
  EXPECT_TRUE(torch::equal(sum.cpu(), expected));
  auto avg = expected.to(torch::kCUDA);
  world.group().all_reduce(avg, cohort::comm::ReduceOp::kAvg);
  EXPECT_TRUE(torch::equal(avg.cpu(), expected));
}

TEST(GpuNccl, DdpStepOnCudaEqualsOneCpuProcess) {
  ASSERT_GT(torch::cuda::device_count(), 0) << "a gpu test started without a GPU";
  torch::manual_seed(3);
  auto reference = torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
  reference->to(torch::kDouble);
  auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
  model->to(torch::kCUDA);
  auto x = torch::randn({32, 6}, torch::kDouble);
  torch::optim::SGD reference_opt(reference->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));

  auto world = nccl_world_of_one();
  cohort::ddp::DistributedDataParallel ddp(torch::nn::Sequential(model), world.group());
  for (int step = 0; step < 3; ++step) {  // the second forward rebuilds the buckets
    reference_opt.zero_grad();
    reference->forward(x).pow(2).mean().backward();
    reference_opt.step();
    opt.zero_grad();
    ddp(x.to(torch::kCUDA)).pow(2).mean().backward();
    opt.step();
  }
  for (std::size_t i = 0; i < reference->parameters().size(); ++i)
    EXPECT_LT((model->parameters()[i].cpu() - reference->parameters()[i]).abs().max().item<double>(), 1e-12)
        << "parameter " << i;
}

}  // namespace
