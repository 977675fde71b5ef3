// cohort::optim's capturable mode (Note [A step inside a CUDA graph] in
// optim/capturable.h) on the CPU, where its arithmetic runs the same kernels as on
// a GPU: the learning rate and step counts read from tensors give the fused step's
// weights under a changing schedule, the host counts follow replays and captures,
// and what cannot run is refused with the fix. The graph itself needs a GPU (tests/gpu).
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <sstream>

#include "cohort/compat/fused_optimizer.h"
#include "cohort/errors.h"
#include "cohort/optim/adam.h"
#include "cohort/optim/sgd.h"

namespace {

using cohort::optim::StepKernel;

std::vector<at::Tensor> params_for(std::uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> out;
  for (auto shape : std::vector<std::vector<std::int64_t>>{{16, 8}, {16}, {4, 16}})
    out.push_back(torch::randn(shape).requires_grad_(true));
  return out;
}

void set_grads(std::vector<at::Tensor>& params, int s) {
  torch::manual_seed(500 + s);
  for (auto& p : params) p.mutable_grad() = torch::randn(p.sizes());
}

double lr_at(int s) { return 1e-2 * (1.0 + std::cos(0.3 * s)) / 2 + 1e-4; }  // a schedule that moves every step

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const cohort::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Capturable, IsRefusedWhereTheFusedKernelCannotRun) {
  auto p = params_for(1);
  if (!cohort::compat::kHasFusedOptimizers) {
    cohort::optim::Adam adam(p, torch::optim::AdamOptions(1e-3));
    const auto why = error_of([&] { adam.capturable(true); });
    EXPECT_NE(why.find("capturable(true) needs the fused kernels"), std::string::npos) << why;
    EXPECT_NE(why.find("LibTorch 2.4 or newer"), std::string::npos) << why;
    EXPECT_FALSE(adam.capturable());
    return;
  }
  cohort::optim::AdamW loop(p, torch::optim::AdamWOptions(1e-3), StepKernel::for_loop);
  auto why = error_of([&] { loop.capturable(true); });
  EXPECT_NE(why.find("the step kernel is for-loop; fix: use StepKernel::fused"), std::string::npos) << why;
  cohort::optim::SGD foreach(p, torch::optim::SGDOptions(0.1).momentum(0.9), StepKernel::foreach);
  why = error_of([&] { foreach.capturable(true); });
  EXPECT_NE(why.find("the step kernel is foreach"), std::string::npos) << why;
  // A step before the learning rate was loaded would read a tensor that is not there.
  cohort::optim::Adam adam(p, torch::optim::AdamOptions(1e-3));
  adam.capturable(true);
  set_grads(p, 0);
  why = error_of([&] { adam.step(); });
  EXPECT_NE(why.find("call load_learning_rates() before every step"), std::string::npos) << why;
}

// Capturable against the plain fused step, same schedule: weights within float
// rounding (the learning rate is a float tensor), host step counts equal.
template <class Opt, class Options>
void expect_follows_fused(Options options, const char* what) {
  if (!cohort::compat::kHasFusedOptimizers) {
    Opt opt(params_for(2), options, StepKernel::fused);
    EXPECT_NE(error_of([&] { opt.capturable(true); }).find("LibTorch 2.4"), std::string::npos) << what;
    return;
  }
  auto a = params_for(2), b = params_for(2);
  Opt plain(a, options, StepKernel::fused);
  Opt captured(b, options, StepKernel::fused);
  captured.capturable(true);
  for (int s = 0; s < 12; ++s) {
    plain.param_groups()[0].options().set_lr(lr_at(s));
    captured.param_groups()[0].options().set_lr(lr_at(s));
    captured.load_learning_rates();
    set_grads(a, s);
    set_grads(b, s);
    plain.step();
    captured.step();
  }
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-7))
        << what << ": parameter " << i << " differs by " << (a[i] - b[i]).abs().max().item<double>();
}

TEST(Capturable, AdamFollowsTheFusedStepUnderAChangingLearningRate) {
  expect_follows_fused<cohort::optim::Adam>(torch::optim::AdamOptions(1e-3).weight_decay(0.01), "Adam");
  expect_follows_fused<cohort::optim::Adam>(torch::optim::AdamOptions(1e-3).amsgrad(true), "Adam amsgrad");
  expect_follows_fused<cohort::optim::AdamW>(torch::optim::AdamWOptions(1e-3).weight_decay(0.1), "AdamW");
  expect_follows_fused<cohort::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true), "SGD");
}

// Note [A step inside a CUDA graph]: a capture counts a step that did not run, a
// replay takes one the host did not see; count_steps corrects the host, and a reset
// after loading a state dict remakes the device counts from the host's.
TEST(Capturable, HostCountsFollowReplaysAndAResetFollowsALoadedState) {
  auto a = params_for(3), b = params_for(3);
  if (!cohort::compat::kHasFusedOptimizers) {  // LibTorch 1.13: nothing to count, the mode is refused
    cohort::optim::Adam adam(a, torch::optim::AdamOptions(1e-3));
    EXPECT_NE(error_of([&] { adam.capturable(true); }).find("LibTorch 2.4"), std::string::npos);
    return;
  }
  cohort::optim::Adam plain(a, torch::optim::AdamOptions(1e-3), StepKernel::fused);
  cohort::optim::Adam captured(b, torch::optim::AdamOptions(1e-3));
  captured.capturable(true);
  captured.load_learning_rates();
  for (int s = 0; s < 3; ++s) {
    set_grads(a, s);
    set_grads(b, s);
    plain.step();
    captured.step();
  }
  auto count = [&](torch::optim::Optimizer& o) {
    return static_cast<torch::optim::AdamParamState&>(*o.state().begin()->second).step();
  };
  EXPECT_EQ(count(captured), 3);
  captured.count_steps(+1);
  EXPECT_EQ(count(captured), 4);
  captured.count_steps(-1);
  EXPECT_EQ(count(captured), 3);
  // Both load the plain one's state at step 3 after it took 2 more steps: without a
  // reset the capturable one would go on from its own device count.
  for (int s = 3; s < 5; ++s) {
    set_grads(a, s);
    plain.step();
  }
  std::stringstream saved;
  {
    torch::serialize::OutputArchive archive;
    plain.save(archive);
    archive.save_to(saved);
  }
  torch::serialize::InputArchive in;
  in.load_from(saved);
  captured.load(in);
  for (std::size_t i = 0; i < a.size(); ++i) b[i].detach().copy_(a[i].detach());
  captured.reset_device_state();
  captured.load_learning_rates();
  set_grads(a, 5);
  set_grads(b, 5);
  plain.step();
  captured.step();
  EXPECT_EQ(count(captured), 6);
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-6, 1e-8)) << "parameter " << i;
}

}  // namespace
