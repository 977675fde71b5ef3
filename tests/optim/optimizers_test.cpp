// cohort::optim's Adam, AdamW and SGD against torch::optim's: the same weights
// after several steps (to the bit for the for-loop and foreach kernels, within float
// rounding for the fused one), the same state dicts in both directions, and the
// refusals.
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <functional>
#include <sstream>

#include "cohort/compat/fused_optimizer.h"
#include "cohort/errors.h"
#include "cohort/optim/adam.h"
#include "cohort/optim/sgd.h"
#include "cohort/zero/state_bytes.h"

namespace {

using cohort::optim::StepKernel;
using Make = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

// Parameters of a small MLP's shapes (a matrix, a bias, a second matrix, a scalar),
// the same values for every call with the same seed.
std::vector<at::Tensor> params_for(std::uint64_t seed, at::ScalarType dtype = at::kFloat) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> out;
  for (auto shape : std::vector<std::vector<std::int64_t>>{{16, 8}, {16}, {4, 16}, {}})
    out.push_back(torch::randn(shape, torch::dtype(dtype)).requires_grad_(true));
  return out;
}

// A gradient for step `s`, the same on both sides; parameter 3 gets none on odd
// steps, so its step count (Adam) and its buffer's age (SGD) fall behind the others'.
void set_grads(std::vector<at::Tensor>& params, int s) {
  torch::manual_seed(1000 + s);
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto g = torch::randn(params[i].sizes(), params[i].options().requires_grad(false));
    params[i].mutable_grad() = (i == 3 && s % 2 == 1) ? at::Tensor() : g;
  }
}

void train(torch::optim::Optimizer& opt, std::vector<at::Tensor>& params, int from, int to) {
  for (int s = from; s < to; ++s) {
    set_grads(params, s);
    opt.step();
  }
}

void expect_same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, bool exact, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (exact)
      EXPECT_TRUE(torch::equal(a[i], b[i])) << what << ": parameter " << i << " differs by "
                                            << (a[i] - b[i]).abs().max().item<double>();
    else
      EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6)) << what << ": parameter " << i << " differs by "
                                                           << (a[i] - b[i]).abs().max().item<double>();
  }
}

struct Case {
  std::string name;
  Make reference;                                    // torch::optim
  std::function<Make(StepKernel)> cohort;            // cohort::optim with a kernel
};

std::vector<Case> cases() {
  using namespace torch::optim;
  auto adam = [](AdamOptions o) {
    return Case{"", [o](auto p) { return std::make_unique<Adam>(p, o); },
                [o](StepKernel k) -> Make { return [o, k](auto p) { return std::make_unique<cohort::optim::Adam>(p, o, k); }; }};
  };
  auto adamw = [](AdamWOptions o) {
    return Case{"", [o](auto p) { return std::make_unique<AdamW>(p, o); },
                [o](StepKernel k) -> Make { return [o, k](auto p) { return std::make_unique<cohort::optim::AdamW>(p, o, k); }; }};
  };
  auto sgd = [](SGDOptions o) {
    return Case{"", [o](auto p) { return std::make_unique<SGD>(p, o); },
                [o](StepKernel k) -> Make { return [o, k](auto p) { return std::make_unique<cohort::optim::SGD>(p, o, k); }; }};
  };
  std::vector<Case> all;
  auto named = [&](Case c, const std::string& n) { c.name = n; all.push_back(std::move(c)); };
  named(adam(AdamOptions(1e-2)), "Adam");
  named(adam(AdamOptions(1e-2).weight_decay(0.1).betas({0.8, 0.99}).eps(1e-6)), "Adam with L2 decay");
  named(adam(AdamOptions(1e-2).amsgrad(true)), "Adam amsgrad");
  named(adamw(AdamWOptions(1e-2).weight_decay(0.1)), "AdamW");
  named(adamw(AdamWOptions(1e-2).weight_decay(0.05).amsgrad(true)), "AdamW amsgrad");
  named(sgd(SGDOptions(0.05)), "SGD");
  named(sgd(SGDOptions(0.05).momentum(0.9)), "SGD momentum");
  named(sgd(SGDOptions(0.05).momentum(0.9).dampening(0.1).weight_decay(1e-2)), "SGD dampening and decay");
  named(sgd(SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-2)), "SGD Nesterov");
  return all;
}

std::vector<StepKernel> kernels() {
  std::vector<StepKernel> k{StepKernel::for_loop, StepKernel::foreach, StepKernel::automatic};
  if (cohort::compat::kHasFusedOptimizers) k.push_back(StepKernel::fused);
  return k;
}

bool exact(StepKernel k) {
  return k == StepKernel::for_loop || k == StepKernel::foreach ||
         (k == StepKernel::automatic && !cohort::compat::kHasFusedOptimizers);
}

TEST(Optimizers, EveryKernelTrainsAsTorchOptimDoes) {
  for (const auto& c : cases()) {
    for (auto k : kernels()) {
      auto mine = params_for(7), theirs = params_for(7);
      auto a = c.cohort(k)(mine);
      auto b = c.reference(theirs);
      train(*a, mine, 0, 6);
      train(*b, theirs, 0, 6);
      expect_same(mine, theirs, exact(k), c.name + " with " + cohort::optim::to_string(k));
      // The parameters moved: a step that did nothing would pass the comparison.
      EXPECT_FALSE(torch::equal(mine[0], params_for(7)[0])) << c.name;
    }
  }
}

TEST(Optimizers, DoubleParametersTrainInAListOfTheirOwn) {
  for (auto k : kernels()) {
    auto mine = params_for(3);
    auto theirs = params_for(3);
    mine.push_back(torch::randn({5}, torch::kDouble).requires_grad_(true));
    theirs.push_back(mine.back().detach().clone().requires_grad_(true));
    cohort::optim::Adam a(mine, torch::optim::AdamOptions(1e-2), k);
    torch::optim::Adam b(theirs, torch::optim::AdamOptions(1e-2));
    train(a, mine, 0, 4);
    train(b, theirs, 0, 4);
    expect_same(mine, theirs, exact(k), "float and double with " + cohort::optim::to_string(k));
  }
}

TEST(Optimizers, ParameterGroupsKeepTheirOwnOptions) {
  for (auto k : kernels()) {
    auto mine = params_for(5), theirs = params_for(5);
    auto groups = [](std::vector<at::Tensor>& p) {
      std::vector<torch::optim::OptimizerParamGroup> g;
      g.emplace_back(std::vector<at::Tensor>{p[0], p[1]});
      g.emplace_back(std::vector<at::Tensor>{p[2], p[3]},
                     std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-1).weight_decay(0.5)));
      return g;
    };
    cohort::optim::AdamW a(groups(mine), torch::optim::AdamWOptions(1e-3), k);
    torch::optim::AdamW b(groups(theirs), torch::optim::AdamWOptions(1e-3));
    train(a, mine, 0, 5);
    train(b, theirs, 0, 5);
    expect_same(mine, theirs, exact(k), "two groups with " + cohort::optim::to_string(k));
  }
}

// The state dict of one side loads into the other, and both go on as one.
template <class Ours, class Theirs, class Options>
void swap_state_and_go_on(Options o, StepKernel k, const std::string& what) {
  auto p1 = params_for(9), p2 = params_for(9), p3 = params_for(9);
  Ours first(p1, o, k);
  Theirs reference(p3, o);
  train(first, p1, 0, 3);
  train(reference, p3, 0, 3);
  // Ours -> theirs.
  std::stringstream saved;
  torch::save(first, saved);
  for (std::size_t i = 0; i < p1.size(); ++i) p2[i].detach().copy_(p1[i].detach());
  Theirs second(p2, o);
  torch::load(second, saved);
  // Theirs -> ours.
  std::stringstream back;
  torch::save(reference, back);
  auto p4 = params_for(9);
  for (std::size_t i = 0; i < p4.size(); ++i) p4[i].detach().copy_(p3[i].detach());
  Ours fourth(p4, o, k);
  torch::load(fourth, back);
  train(first, p1, 3, 6);
  train(second, p2, 3, 6);
  train(reference, p3, 3, 6);
  train(fourth, p4, 3, 6);
  expect_same(p1, p2, exact(k), what + ": ours saved, torch::optim loaded");
  expect_same(p3, p4, exact(k), what + ": torch::optim saved, ours loaded");
  expect_same(p1, p3, exact(k), what + ": ours against torch::optim throughout");
}

TEST(Optimizers, StateDictsLoadEitherWay) {
  for (auto k : kernels()) {
    swap_state_and_go_on<cohort::optim::Adam, torch::optim::Adam>(torch::optim::AdamOptions(1e-2).amsgrad(true), k,
                                                                   "Adam " + cohort::optim::to_string(k));
    swap_state_and_go_on<cohort::optim::AdamW, torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2), k,
                                                                     "AdamW " + cohort::optim::to_string(k));
    swap_state_and_go_on<cohort::optim::SGD, torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9), k,
                                                                 "SGD " + cohort::optim::to_string(k));
  }
}

// ZeRO and the checkpoints find an optimizer's state by its type (zero/state_bytes.h,
// checkpoint/split_state.cpp): ours is torch::optim's.
TEST(Optimizers, ZeroCountsTheirStateAsTorchOptims) {
  for (auto k : kernels()) {
    auto mine = params_for(6), theirs = params_for(6);
    cohort::optim::Adam a(mine, torch::optim::AdamOptions(1e-2).amsgrad(true), k);
    torch::optim::Adam b(theirs, torch::optim::AdamOptions(1e-2).amsgrad(true));
    cohort::optim::SGD c(mine, torch::optim::SGDOptions(0.1).momentum(0.9), k);
    torch::optim::SGD d(theirs, torch::optim::SGDOptions(0.1).momentum(0.9));
    set_grads(mine, 0);
    set_grads(theirs, 0);
    a.step();
    b.step();
    c.step();
    d.step();
    EXPECT_EQ(cohort::zero::optimizer_state_bytes(a), cohort::zero::optimizer_state_bytes(b));
    EXPECT_GT(cohort::zero::optimizer_state_bytes(a), 0);
    EXPECT_EQ(cohort::zero::optimizer_state_bytes(c), cohort::zero::optimizer_state_bytes(d));
    EXPECT_GT(cohort::zero::optimizer_state_bytes(c), 0);
  }
}

TEST(Optimizers, AParameterWithoutAGradientGetsNoState) {
  auto p = params_for(2);
  cohort::optim::Adam a(p, torch::optim::AdamOptions(1e-2), StepKernel::foreach);
  set_grads(p, 1);  // parameter 3 has none on odd steps
  const auto before = p[3].detach().clone();
  a.step();
  EXPECT_EQ(a.state().size(), 3u);
  EXPECT_TRUE(torch::equal(p[3], before));
}

TEST(Optimizers, AClosureIsCalledWithGradients) {
  auto p = params_for(4);
  cohort::optim::SGD s(p, torch::optim::SGDOptions(0.1), StepKernel::foreach);
  const auto before = p[0].detach().clone();
  auto loss = s.step([&] {
    for (auto& t : p) t.mutable_grad() = at::Tensor();
    auto l = p[0].sum();
    l.backward();
    return l;
  });
  EXPECT_TRUE(loss.defined());
  EXPECT_TRUE(torch::allclose(p[0], before - 0.1));
}

TEST(Optimizers, AGradientOfAnotherDtypeIsRefusedWithTheParameter) {
  auto p = params_for(1);
  cohort::optim::Adam a(p, torch::optim::AdamOptions(1e-2), StepKernel::foreach);
  set_grads(p, 0);
  p[2].mutable_grad() = p[2].grad().to(torch::kDouble);
  try {
    a.step();
    FAIL() << "a double gradient of a float parameter was taken";
  } catch (const cohort::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("parameter 2 of its group"), std::string::npos) << m;
    EXPECT_NE(m.find("Double"), std::string::npos) << m;
    EXPECT_NE(m.find("fix:"), std::string::npos) << m;
  }
}

TEST(Optimizers, ASparseGradientIsRefused) {
  auto p = params_for(1);
  cohort::optim::SGD s(p, torch::optim::SGDOptions(0.1).momentum(0.9), StepKernel::foreach);
  set_grads(p, 0);
  p[1].mutable_grad() = p[1].grad().to_sparse();
  EXPECT_THROW(s.step(), cohort::ConfigError);
}

TEST(Optimizers, TorchOptimsChecksOfTheOptionsStillHold) {
  auto p = params_for(1);
  EXPECT_THROW(cohort::optim::Adam(p, torch::optim::AdamOptions(-1.0)), c10::Error);
  EXPECT_THROW(cohort::optim::SGD(p, torch::optim::SGDOptions(0.1).nesterov(true)), c10::Error);
}

}  // namespace
