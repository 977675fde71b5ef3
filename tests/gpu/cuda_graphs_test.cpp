// CUDA graphs on one GPU (labelled `gpu`): a whole DDP step over NCCL, captured by
// cohort::cuda_graphs::CapturedStep and replayed, trains as the same steps run
// eagerly do; and a DDP setting a replay cannot honour is refused before any
// capture begins, leaving the GPU usable (Note [One graph for the whole step]).
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "cohort/comm/world.h"
#include "cohort/cuda_graphs/captured_step.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "cohort/optim/adam.h"

namespace {
using namespace std::chrono_literals;

cohort::comm::World nccl_world() {
  return cohort::comm::World::init_with_store(c10::make_intrusive<c10d::HashStore>(), 0, 1,
                                              cohort::comm::InitOptions().backend("nccl").timeout(60s));
}

torch::nn::Sequential mlp() {
  torch::manual_seed(5);
  return torch::nn::Sequential(torch::nn::Linear(12, 64), torch::nn::ReLU(), torch::nn::Linear(64, 5));
}

double lr_at(int s) { return 1e-2 / (1 + s); }

TEST(GpuGraphs, ACapturedDdpStepTrainsAsEagerStepsDo) {
  ASSERT_GT(torch::cuda::device_count(), 0) << "a gpu test started without a GPU";
  const auto cuda = torch::Device(torch::kCUDA, 0);
  constexpr int kSteps = 9;
  torch::manual_seed(6);
  std::vector<at::Tensor> xs, ys;
  for (int s = 0; s < kSteps; ++s) {
    xs.push_back(torch::randn({32, 12}).to(cuda));
    ys.push_back(torch::randint(0, 5, {32}).to(cuda));
  }
  // The reference: the same steps, eagerly, without DDP (a world of one averages nothing).
  auto reference = mlp();
  reference->to(cuda);
  cohort::optim::Adam reference_opt(reference->parameters(), torch::optim::AdamOptions(1e-2), cohort::optim::StepKernel::fused);
  for (int s = 0; s < kSteps; ++s) {
    reference_opt.param_groups()[0].options().set_lr(lr_at(s));
    reference_opt.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(xs[s]), ys[s]).backward();
    reference_opt.step();
  }

  auto world = nccl_world();
  auto model = mlp();
  model->to(cuda);
  // Bucket views keep the buckets' all-reduce over NCCL at a world of one, so the
  // graph holds a collective (Note [A group of one] skips it otherwise).
  cohort::ddp::DistributedDataParallel ddp(
      model, world.group(), cohort::ddp::DistributedDataParallelOptions().gradient_as_bucket_view(true));
  cohort::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  opt.capturable(true);
  auto x = torch::empty({32, 12}, cuda), y = torch::empty({32}, torch::TensorOptions(cuda).dtype(torch::kLong));
  cohort::cuda_graphs::CapturedStep step(
      [&] {
        opt.zero_grad();
        auto loss = torch::nn::functional::cross_entropy(ddp(x), y);
        loss.backward();
        opt.step();
        return loss.detach();
      },
      cohort::cuda_graphs::CapturedStepOptions(cuda).warmup_steps(3));
  step.use(ddp).use(opt);
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    x.copy_(xs[s]);
    y.copy_(ys[s]);
    opt.param_groups()[0].options().set_lr(lr_at(s));
    losses.push_back(step.run().item<double>());
  }
  EXPECT_TRUE(step.captured());
  EXPECT_EQ(static_cast<torch::optim::AdamParamState&>(*opt.state().begin()->second).step(), kSteps);
  for (std::size_t i = 0; i < reference->parameters().size(); ++i)
    EXPECT_LT((model->parameters()[i] - reference->parameters()[i]).abs().max().item<double>(), 1e-5)
        << "parameter " << i;
  EXPECT_LT(losses.back(), losses.front());
}

TEST(GpuGraphs, ADdpSettingAReplayCannotHonourIsRefusedBeforeTheCapture) {
  ASSERT_GT(torch::cuda::device_count(), 0) << "a gpu test started without a GPU";
  const auto cuda = torch::Device(torch::kCUDA, 0);
  auto world = nccl_world();
  auto model = mlp();
  model->to(cuda);
  cohort::ddp::DistributedDataParallel ddp(
      model, world.group(), cohort::ddp::DistributedDataParallelOptions().find_unused_parameters(true));
  cohort::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  opt.capturable(true);
  auto x = torch::randn({8, 12}, cuda);
  cohort::cuda_graphs::CapturedStep step(
      [&] {
        opt.zero_grad();
        auto loss = ddp(x).pow(2).mean();
        loss.backward();
        opt.step();
        return loss.detach();
      },
      cohort::cuda_graphs::CapturedStepOptions(cuda).warmup_steps(2));
  step.use(ddp).use(opt);
  step.run();
  step.run();
  try {
    step.run();
    FAIL() << "find_unused_parameters was captured";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("find_unused_parameters"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(step.captured());
  EXPECT_TRUE(torch::isfinite(ddp(x).sum()).item<bool>());  // no capture was left open
}

}  // namespace
