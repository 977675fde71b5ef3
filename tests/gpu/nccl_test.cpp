// NCCL on one GPU (labelled `gpu`, like gpu_test.cpp): a world of one over an
// in-memory store, so no launcher and no network. It proves that cohort's NCCL
// backend starts against the NCCL torch loads, and that DDP's step on CUDA over NCCL
// computes what a single process computes on the CPU.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <future>
#include <thread>

#include "cohort/comm/world.h"
#include "cohort/errors.h"
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

// Rank 0 of a world of two whose rank 1 never starts: its wait must end within
// the timeout with an error naming rank 1, whether it comes while joining (the
// first GPU run: "rank 0 waited 8 s for every rank to join") or in the first
// collective, never waiting in NCCL's set-up for ever. It runs on a thread of its
// own, so that a wait that is not bounded fails this test at 40 s instead of
// hanging it (scripts/gpu-check runs this test alone, after the others, with a
// ctest timeout of 60 s).
TEST(GpuNccl, ARankThatNeverStartedEndsTheWaitInTimeNamingIt) {
  ASSERT_GT(torch::cuda::device_count(), 0) << "a gpu test started without a GPU";
  auto verdict = std::make_shared<std::promise<std::string>>();
  auto got = verdict->get_future();
  std::thread([verdict] {
    try {
      auto world = cohort::comm::World::init_with_store(
          c10::make_intrusive<c10d::HashStore>(), 0, 2,
          cohort::comm::InitOptions().backend("nccl").timeout(8s).join_timeout(8s));
      auto t = torch::ones({4}, torch::kCUDA);
      world.group().all_reduce(t);
      verdict->set_value("no error");
    } catch (const cohort::TimeoutError& e) {
      const bool named = e.missing_ranks() == std::vector<int>{1};
      verdict->set_value(std::string(named ? "timeout in " : "wrong missing ranks in ") + e.operation() + ": " +
                         e.what());
    } catch (const std::exception& e) {
      verdict->set_value(std::string("other error: ") + e.what());
    }
  }).detach();
  ASSERT_EQ(got.wait_for(40s), std::future_status::ready)
      << "no verdict within 40 s: rank 0 waited for a rank that never started without a bound";
  const auto v = got.get();
  EXPECT_EQ(v.rfind("timeout in ", 0), 0u) << v;
  EXPECT_NE(v.find("rank 1"), std::string::npos) << v;
  EXPECT_NE(v.find("fix:"), std::string::npos) << "the error says no fix: " << v;
}

}  // namespace
