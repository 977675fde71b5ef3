// Activation checkpointing in one process (recompute/checkpoint.h): the gradients
// equal those of a plain backward bit for bit (dropout, BatchNorm and autocast
// included), a checkpointed segment runs its forward exactly twice, and BatchNorm's
// running statistics are updated once.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/amp/autocast.h"
#include "cohort/errors.h"
#include "cohort/recompute/checkpoint.h"

namespace {

using cohort::recompute::checkpoint;
using cohort::recompute::checkpoint_sequential;
using cohort::recompute::CheckpointOptions;
using cohort::recompute::TensorList;

torch::nn::Sequential make_model(bool batch_norm = false) {
  torch::manual_seed(11);
  torch::nn::Sequential m;
  m->push_back(torch::nn::Linear(8, 16));
  m->push_back(torch::nn::Tanh());
  m->push_back(torch::nn::Dropout(0.3));
  if (batch_norm) m->push_back(torch::nn::BatchNorm1d(16));
  m->push_back(torch::nn::Linear(16, 16));
  m->push_back(torch::nn::ReLU());
  m->push_back(torch::nn::Dropout(0.2));
  m->push_back(torch::nn::Linear(16, 4));
  return m;
}

struct Result {
  std::vector<torch::Tensor> grads;  // parameters', then the input's
  std::vector<torch::Tensor> buffers;
};

Result run(torch::nn::Sequential& m, const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
  m->zero_grad();
  auto x = torch::randn({6, 8}, torch::TensorOptions().dtype(torch::kFloat)).set_requires_grad(true);
  torch::manual_seed(5);  // the dropout masks
  forward(x).pow(2).sum().backward();
  Result r;
  for (auto& p : m->parameters()) r.grads.push_back(p.grad().clone());
  r.grads.push_back(x.grad().clone());
  for (auto& b : m->buffers()) r.buffers.push_back(b.clone());
  return r;
}

void expect_bitwise(const Result& a, const Result& b) {
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (std::size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(torch::equal(a.grads[i], b.grads[i])) << "gradient " << i;
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  for (std::size_t i = 0; i < a.buffers.size(); ++i) EXPECT_TRUE(torch::equal(a.buffers[i], b.buffers[i])) << "buffer " << i;
}

TEST(Checkpoint, SequentialGradientsAreBitwiseThoseOfAPlainBackwardWithDropout) {
  auto plain_model = make_model(), ckpt_model = make_model();
  torch::manual_seed(1);
  auto plain = run(plain_model, [&](const torch::Tensor& x) { return plain_model->forward(x); });
  for (int segments : {1, 2, 3, 7}) {
    torch::manual_seed(1);
    auto ckpt = run(ckpt_model, [&](const torch::Tensor& x) { return checkpoint_sequential(ckpt_model, segments, x); });
    SCOPED_TRACE("segments " + std::to_string(segments));
    expect_bitwise(plain, ckpt);
  }
}

TEST(Checkpoint, AFunctionWithAndWithoutItsModulesGivesTheSameGradients) {
  auto plain_model = make_model();
  torch::manual_seed(1);
  auto plain = run(plain_model, [&](const torch::Tensor& x) { return plain_model->forward(x); });
  for (bool give_modules : {true, false}) {
    auto m = make_model();
    torch::manual_seed(1);
    CheckpointOptions options;
    if (give_modules) options.modules({m.ptr()});
    auto got = run(m, [&](const torch::Tensor& x) {
      return checkpoint([&](const TensorList& in) { return TensorList{m->forward(in[0])}; }, {x}, options)[0];
    });
    SCOPED_TRACE(give_modules ? "modules given" : "no modules");
    expect_bitwise(plain, got);
  }
}

TEST(Checkpoint, ASegmentRunsItsForwardExactlyTwicePerStep) {
  int first = 0, last = 0;
  torch::nn::Sequential m;
  m->push_back(torch::nn::Linear(4, 4));
  m->push_back(torch::nn::Functional([&first](torch::Tensor x) {
    ++first;
    return torch::tanh(x);
  }));
  m->push_back(torch::nn::Linear(4, 4));
  m->push_back(torch::nn::Functional([&last](torch::Tensor x) {
    ++last;
    return torch::relu(x);
  }));
  auto x = torch::randn({3, 4});
  auto y = checkpoint_sequential(m, 2, x);
  EXPECT_EQ(first, 1);
  y.sum().backward();
  EXPECT_EQ(first, 2);  // checkpointed: forward, then the recomputation
  EXPECT_EQ(last, 1);   // the last segment is not checkpointed
  EXPECT_TRUE(m[0]->as<torch::nn::Linear>()->weight.grad().defined());
}

TEST(Checkpoint, BatchNormRunningStatisticsAreUpdatedOnce) {
  auto plain_model = make_model(true), ckpt_model = make_model(true);
  torch::manual_seed(1);
  auto plain = run(plain_model, [&](const torch::Tensor& x) { return plain_model->forward(x); });
  torch::manual_seed(1);
  auto ckpt = run(ckpt_model, [&](const torch::Tensor& x) { return checkpoint_sequential(ckpt_model, 2, x); });
  expect_bitwise(plain, ckpt);
  auto bn = ckpt_model[3]->as<torch::nn::BatchNorm1d>();
  ASSERT_NE(bn, nullptr);
  EXPECT_EQ(bn->num_batches_tracked.item<std::int64_t>(), 1);
}

TEST(Checkpoint, TheRecomputationRunsUnderTheForwardsAutocast) {
  auto plain_model = make_model(), ckpt_model = make_model();
  auto under_autocast = [](torch::nn::Sequential& m, bool ckpt) {
    return [&m, ckpt](const torch::Tensor& x) {
      cohort::amp::Autocast autocast{cohort::amp::AutocastOptions(torch::kCPU)};
      return (ckpt ? checkpoint_sequential(m, 3, x) : m->forward(x)).to(torch::kFloat);
    };
  };
  torch::manual_seed(1);
  auto plain = run(plain_model, under_autocast(plain_model, false));
  torch::manual_seed(1);
  auto ckpt = run(ckpt_model, under_autocast(ckpt_model, true));  // backward runs outside the guard
  expect_bitwise(plain, ckpt);
}

// The recomputation's weight casts must not outlive its step: after the optimizer's
// update, the next autocast forward sees the new weights (review of issue 14).
TEST(Checkpoint, TheNextStepUnderAutocastSeesTheUpdatedWeights) {
  torch::manual_seed(4);
  torch::nn::Linear lin(8, 8);
  auto x = torch::randn({4, 8});
  const auto autocast = cohort::amp::AutocastOptions(torch::kCPU);
  torch::Tensor y;
  {
    cohort::amp::Autocast guard(autocast);
    y = checkpoint([&](const TensorList& in) { return TensorList{lin(in[0])}; }, {x},
                   CheckpointOptions().modules({lin.ptr()}))[0];
  }
  y.to(torch::kFloat).sum().backward();
  torch::optim::SGD(lin->parameters(), 0.5).step();
  torch::Tensor z;
  {
    cohort::amp::Autocast guard(autocast);
    z = lin(x);
  }
  auto expected = torch::nn::functional::linear(x.to(torch::kBFloat16), lin->weight.to(torch::kBFloat16),
                                                lin->bias.to(torch::kBFloat16));
  EXPECT_TRUE(torch::equal(z, expected));
}

TEST(Checkpoint, ATensorOutsideTheGivenModulesIsRefusedNotLeftWithoutGradient) {
  torch::nn::Linear lin(3, 3);
  auto extra = torch::ones({3}, torch::requires_grad());
  auto y = checkpoint([&](const TensorList& in) { return TensorList{lin(in[0]) * extra}; }, {torch::randn({2, 3})},
                      CheckpointOptions().modules({lin.ptr()}))[0];
  try {
    y.sum().backward();
    FAIL() << "no error";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("neither one of its inputs nor a parameter"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, GradOfASegmentWithoutModulesIsRefused) {
  torch::nn::Linear lin(3, 3);
  auto x = torch::randn({2, 3}, torch::requires_grad());
  auto y = checkpoint([&](const TensorList& in) { return TensorList{lin(in[0])}; }, {x})[0];
  EXPECT_THROW(torch::autograd::grad({y.sum()}, {x}), cohort::ConfigError);
  EXPECT_FALSE(lin->weight.grad().defined());
}

TEST(Checkpoint, WithoutGradientsItIsAPlainForward) {
  auto m = make_model();
  m->eval();
  auto x = torch::randn({2, 8});
  torch::NoGradGuard no_grad;
  auto y = checkpoint_sequential(m, 2, x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(torch::equal(y, m->forward(x)));
}

TEST(Checkpoint, RefusesSegmentCountsThatDoNotFit) {
  auto m = make_model();
  auto x = torch::randn({2, 8});
  EXPECT_THROW(checkpoint_sequential(m, 0, x), cohort::ConfigError);
  EXPECT_THROW(checkpoint_sequential(m, 8, x), cohort::ConfigError);
}

}  // namespace
