// CUDA graphs on one GPU (labelled `gpu`): a whole DDP step over NCCL, captured by
// cohort::cuda_graphs::CapturedStep and replayed, trains as the same steps run
// eagerly do, step by step and with an NCCL all-reduce in the graph; and what a
// replay cannot honour (DDP built on another stream, find_unused_parameters) is
// refused before any capture begins, leaving the GPU usable (Note [One graph for
// the whole step]).
#include <c10/core/StreamGuard.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <cmath>
#include <optional>

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
  std::vector<double> reference_losses;
  for (int s = 0; s < kSteps; ++s) {
    reference_opt.param_groups()[0].options().set_lr(lr_at(s));
    reference_opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(reference->forward(xs[s]), ys[s]);
    loss.backward();
    reference_opt.step();
    reference_losses.push_back(loss.item<double>());
  }

  auto world = nccl_world();
  auto model = mlp();
  model->to(cuda);
  // Bucket views make the hooks copy each gradient into its bucket inside the graph
  // (at a world of one the default hook then reduces nothing: Note [A group of one]).
  // DDP is built on the capture stream (Note [Gradient accumulators on the capture
  // stream]); the next test checks that one built elsewhere is refused.
  auto stream = cohort::cuda_graphs::capture_stream(cuda);
  std::optional<cohort::ddp::DistributedDataParallel<torch::nn::Sequential>> built;
  {
    c10::StreamGuard on(stream);
    built.emplace(model, world.group(), cohort::ddp::DistributedDataParallelOptions().gradient_as_bucket_view(true));
  }
  stream.synchronize();
  auto& ddp = *built;
  cohort::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  opt.capturable(true);
  auto x = torch::empty({32, 12}, cuda), y = torch::empty({32}, torch::TensorOptions(cuda).dtype(torch::kLong));
  cohort::cuda_graphs::CapturedStep step(
      [&] {
        opt.zero_grad();
        auto loss = torch::nn::functional::cross_entropy(ddp(x), y);
        loss.backward();
        opt.step();
        // One NCCL collective the graph must hold and replay: the loss summed over
        // the world of one, waited for on the stream (comm::Pending::wait in a capture).
        auto total = loss.detach().clone();
        world.group().all_reduce_async(total).wait();
        return total;
      },
      cohort::cuda_graphs::CapturedStepOptions(cuda).stream(stream).warmup_steps(3));
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
  for (int s = 0; s < kSteps; ++s)  // each replay's loss, through the replayed all-reduce
    EXPECT_NEAR(losses[s], reference_losses[s], 1e-5 * (1 + std::abs(reference_losses[s]))) << "step " << s;
  EXPECT_LT(losses.back(), losses.front());
}

TEST(GpuGraphs, WhatAReplayCannotHonourIsRefusedBeforeTheCapture) {
  ASSERT_GT(torch::cuda::device_count(), 0) << "a gpu test started without a GPU";
  const auto cuda = torch::Device(torch::kCUDA, 0);
  auto world = nccl_world();
  auto step_of = [&](cohort::ddp::DistributedDataParallel<torch::nn::Sequential>& ddp, cohort::optim::Adam& opt,
                     const at::Tensor& x) {
    return [&ddp, &opt, x] {
      opt.zero_grad();
      auto loss = ddp(x).pow(2).mean();
      loss.backward();
      opt.step();
      return loss.detach();
    };
  };
  auto x = torch::randn({8, 12}, cuda);
  auto stream = cohort::cuda_graphs::capture_stream(cuda);

  // DDP built on the default stream: its gradient accumulators would run off the
  // captured stream (Note [Gradient accumulators on the capture stream]).
  auto elsewhere = mlp();
  elsewhere->to(cuda);
  cohort::ddp::DistributedDataParallel on_default(elsewhere, world.group());
  cohort::optim::Adam opt1(elsewhere->parameters(), torch::optim::AdamOptions(1e-2));
  opt1.capturable(true);
  cohort::cuda_graphs::CapturedStep step1(step_of(on_default, opt1, x),
                                          cohort::cuda_graphs::CapturedStepOptions(cuda).stream(stream));
  try {
    step1.use(on_default);
    FAIL() << "DDP built on another stream was taken";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("build DDP under c10::StreamGuard"), std::string::npos) << e.what();
  }

  // find_unused_parameters: refused at the capture, after the eager steps.
  auto model = mlp();
  model->to(cuda);
  std::optional<cohort::ddp::DistributedDataParallel<torch::nn::Sequential>> built;
  {
    c10::StreamGuard on(stream);
    built.emplace(model, world.group(), cohort::ddp::DistributedDataParallelOptions().find_unused_parameters(true));
  }
  stream.synchronize();
  cohort::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  opt.capturable(true);
  cohort::cuda_graphs::CapturedStep step(step_of(*built, opt, x),
                                         cohort::cuda_graphs::CapturedStepOptions(cuda).stream(stream).warmup_steps(2));
  step.use(*built).use(opt);
  step.run();
  step.run();
  try {
    step.run();
    FAIL() << "find_unused_parameters was captured";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("find_unused_parameters"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(step.captured());
  EXPECT_TRUE(torch::isfinite((*built)(x).sum()).item<bool>());  // no capture was left open
}

}  // namespace
