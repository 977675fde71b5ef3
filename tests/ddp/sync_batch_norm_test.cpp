// SyncBatchNorm with ranks as threads over one in-memory store, checked against
// torch::nn::BatchNorm on the whole batch in one process: outputs, input and
// parameter gradients, running statistics. And convert_sync_batchnorm.
#include "cohort/ddp/sync_batch_norm.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <cmath>
#include <future>
#include <numeric>
#include <string>
#include <vector>

#include "cohort/comm/world.h"
#include "cohort/errors.h"
#include "support/thread_world.h"

namespace {
using cohort::comm::InitOptions;
using cohort::comm::World;
using cohort::ddp::SyncBatchNorm;
using cohort::ddp::SyncBatchNormImpl;
using cohort::ddp::SyncBatchNormOptions;
using namespace std::chrono_literals;

using cohort::testing::run_thread_world;

bool close(const at::Tensor& a, const at::Tensor& b) { return torch::allclose(a, b, /*rtol=*/1e-4, /*atol=*/1e-5); }

template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const cohort::ConfigError& e) {
    return e.what();
  }
  return "no ConfigError";
}

// A global batch split unevenly over ranks, and what one process computes on it.
struct Case {
  std::vector<std::int64_t> batches;       // samples per rank
  std::vector<std::int64_t> sample_shape;  // {C, *}
  c10::optional<double> momentum = 0.1;
  int steps = 2;

  std::int64_t channels() const { return sample_shape[0]; }
  std::int64_t begin(int rank) const { return std::accumulate(batches.begin(), batches.begin() + rank, 0L); }
  at::Tensor slice(const at::Tensor& t, int rank) const { return t.narrow(0, begin(rank), batches[rank]); }
};

struct Expected {
  at::Tensor weight, bias;                          // initial parameters
  std::vector<at::Tensor> x, r;                     // per step: input, loss weights
  std::vector<at::Tensor> out, grad_x, grad_w, grad_b;
  at::Tensor running_mean, running_var;
};

// Everything random is drawn here, before any rank thread starts: manual_seed is global.
template <typename BatchNorm>
Expected reference(BatchNorm bn, const Case& c) {
  torch::manual_seed(7);
  Expected e;
  e.weight = torch::rand({c.channels()}) + 0.5;
  e.bias = torch::randn({c.channels()});
  {
    torch::NoGradGuard no_grad;
    bn->weight.copy_(e.weight);
    bn->bias.copy_(e.bias);
  }
  std::vector<std::int64_t> shape{std::accumulate(c.batches.begin(), c.batches.end(), 0L)};
  shape.insert(shape.end(), c.sample_shape.begin(), c.sample_shape.end());
  for (int s = 0; s < c.steps; ++s) {
    e.x.push_back(torch::randn(shape) * 2 + 1.5);
    e.r.push_back(torch::randn(shape));
    auto x = e.x.back().clone().requires_grad_();
    auto out = bn(x);
    (out * e.r.back()).sum().backward();
    e.out.push_back(out.detach());
    e.grad_x.push_back(x.grad());
    e.grad_w.push_back(bn->weight.grad().clone());
    e.grad_b.push_back(bn->bias.grad().clone());
    bn->zero_grad();
  }
  e.running_mean = bn->running_mean.clone();
  e.running_var = bn->running_var.clone();
  return e;
}

Expected reference(const Case& c) {
  auto options = torch::nn::BatchNormOptions(c.channels()).momentum(c.momentum);
  if (c.sample_shape.size() == 3) return reference(torch::nn::BatchNorm2d(options), c);
  return reference(torch::nn::BatchNorm1d(options), c);
}

// Each rank trains a SyncBatchNorm on its slice and compares with the reference.
void check_against_reference(const Case& c) {
  const auto e = reference(c);
  run_thread_world(static_cast<int>(c.batches.size()), [&](World& world) {
    auto& g = world.group();
    const int r = g.rank();
    SyncBatchNorm bn(SyncBatchNormOptions(c.channels()).momentum(c.momentum).group(g));
    {
      torch::NoGradGuard no_grad;
      bn->weight.copy_(e.weight);
      bn->bias.copy_(e.bias);
    }
    for (int s = 0; s < c.steps; ++s) {
      auto x = c.slice(e.x[s], r).clone().requires_grad_();
      auto out = bn(x);
      (out * c.slice(e.r[s], r)).sum().backward();
      EXPECT_TRUE(close(out, c.slice(e.out[s], r))) << "rank " << r << ", step " << s;
      EXPECT_TRUE(close(x.grad(), c.slice(e.grad_x[s], r))) << "rank " << r << ", step " << s;
      // Each rank holds its own loss's share of the parameter gradients; DDP would sum them.
      auto grad_w = bn->weight.grad().clone();
      auto grad_b = bn->bias.grad().clone();
      g.all_reduce(grad_w);
      g.all_reduce(grad_b);
      EXPECT_TRUE(close(grad_w, e.grad_w[s])) << "rank " << r << ", step " << s;
      EXPECT_TRUE(close(grad_b, e.grad_b[s])) << "rank " << r << ", step " << s;
      bn->zero_grad();
    }
    EXPECT_TRUE(close(bn->running_mean, e.running_mean)) << "rank " << r;
    EXPECT_TRUE(close(bn->running_var, e.running_var)) << "rank " << r;
    EXPECT_EQ(bn->num_batches_tracked.item<std::int64_t>(), c.steps);
  });
}

// Uneven batches: rank r holds r + 2 samples, or 5 in a world of one.
std::vector<std::int64_t> uneven(int world) {
  if (world == 1) return {5};
  std::vector<std::int64_t> b;
  for (int r = 0; r < world; ++r) b.push_back(r + 2);
  return b;
}

class SyncBatchNormWorlds : public ::testing::TestWithParam<int> {};

TEST_P(SyncBatchNormWorlds, MatchesBatchNorm2dOnTheGlobalBatch) {
  check_against_reference({uneven(GetParam()), {3, 4, 5}});
}

TEST_P(SyncBatchNormWorlds, MatchesBatchNorm1dOnTheGlobalBatch) {
  check_against_reference({uneven(GetParam()), {4}});
}

INSTANTIATE_TEST_SUITE_P(Sizes, SyncBatchNormWorlds, ::testing::Values(1, 2, 3));

TEST(SyncBatchNorm, CumulativeAverageMatchesTorch) {
  check_against_reference({{3, 2}, {2, 3, 3}, c10::nullopt, /*steps=*/3});
}

TEST(SyncBatchNorm, NamesParametersAndBuffersLikeTorch) {
  auto names = [](torch::nn::Module& m) {
    std::vector<std::string> out;
    for (const auto& p : m.named_parameters()) out.push_back(p.key());
    for (const auto& b : m.named_buffers()) out.push_back(b.key());
    return out;
  };
  SyncBatchNorm sync(4);
  torch::nn::BatchNorm2d torch_bn(4);
  EXPECT_EQ(names(*sync), names(*torch_bn));
  SyncBatchNorm bare(SyncBatchNormOptions(4).affine(false).track_running_stats(false));
  torch::nn::BatchNorm2d torch_bare(torch::nn::BatchNormOptions(4).affine(false).track_running_stats(false));
  EXPECT_EQ(names(*bare), names(*torch_bare));
}

TEST(SyncBatchNorm, EvalUsesRunningStatsAndNeverCommunicates) {
  torch::manual_seed(3);
  const auto train = torch::randn({2, 2, 3, 3}) + 1;
  const auto eval = torch::randn({4, 2, 3, 3});
  run_thread_world(2, [&](World& world) {
    SyncBatchNorm bn(SyncBatchNormOptions(2).group(world.group()));
    bn(train);  // both ranks: running statistics move away from 0 and 1
    if (world.rank() != 0) return;  // only rank 0 evaluates; a collective would hang
    bn->eval();
    const auto mean = bn->running_mean.clone();
    auto expected = (eval - mean.view({1, 2, 1, 1})) / (bn->running_var.view({1, 2, 1, 1}) + 1e-5).sqrt() *
                        bn->weight.view({1, 2, 1, 1}) + bn->bias.view({1, 2, 1, 1});
    EXPECT_TRUE(close(bn(eval), expected));
    EXPECT_TRUE(torch::equal(bn->running_mean, mean));
    EXPECT_EQ(bn->num_batches_tracked.item<std::int64_t>(), 1);
  });
  SyncBatchNorm no_group(2);  // eval needs no group at all
  no_group->eval();
  EXPECT_TRUE(close(no_group(eval), eval / std::sqrt(1 + 1e-5)));
}

TEST(SyncBatchNorm, TrainingWithoutAGroupSaysHowToPassOne) {
  SyncBatchNorm bn(3);
  auto message = error_of([&] { bn(torch::randn({4, 3})); });
  EXPECT_NE(message.find("world.group()"), std::string::npos) << message;
}

TEST(SyncBatchNorm, WrongInputShapesNameExpectedAndActual) {
  SyncBatchNorm bn(3);
  auto message = error_of([&] { bn(torch::randn({4, 5, 2})); });
  EXPECT_NE(message.find("expects 3 channels"), std::string::npos) << message;
  EXPECT_NE(message.find("got 5"), std::string::npos) << message;
  message = error_of([&] { bn(torch::randn({3})); });
  EXPECT_NE(message.find("at least 2 dimensions"), std::string::npos) << message;
}

TEST(SyncBatchNorm, OneValuePerChannelIsAnErrorOnEveryRank) {
  run_thread_world(2, [](World& world) {
    SyncBatchNorm bn(SyncBatchNormOptions(3).group(world.group()));
    // One sample in all: rank 1's batch is empty. Every rank sees the global count,
    // so all throw and none waits for the others.
    auto message = error_of([&] { bn(torch::randn({1 - world.rank(), 3})); });
    EXPECT_NE(message.find("more than 1 value per channel"), std::string::npos) << message;
    EXPECT_EQ(bn->num_batches_tracked.item<std::int64_t>(), 0);
  });
  run_thread_world(1, [](World& world) {
    SyncBatchNorm bn(SyncBatchNormOptions(3).group(world.group()));
    EXPECT_THROW(bn(torch::randn({1, 3})), cohort::ConfigError);
  });
}

// --- convert_sync_batchnorm -------------------------------------------------------

// LibTorch cannot hold a Sequential inside a Sequential (its forward is a template),
// so the inner one is a Sequential with a plain forward.
struct StageImpl : torch::nn::SequentialImpl {
  using SequentialImpl::SequentialImpl;
  at::Tensor forward(const at::Tensor& x) { return SequentialImpl::forward(x); }
};
TORCH_MODULE(Stage);

template <typename Impl>
std::shared_ptr<Impl> child(torch::nn::SequentialImpl& seq, std::size_t index) {
  return std::dynamic_pointer_cast<Impl>(seq.ptr(index));
}

// Sequential(Conv2d, BatchNorm2d, ReLU, Stage(Flatten, Linear, BatchNorm1d)) with
// non-trivial state; the same every call.
torch::nn::Sequential small_net() {
  torch::manual_seed(11);
  torch::nn::Sequential net(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)), torch::nn::BatchNorm2d(4), torch::nn::ReLU(),
      Stage(torch::nn::Flatten(), torch::nn::Linear(4 * 6 * 6, 5), torch::nn::BatchNorm1d(5)));
  net->forward(torch::randn({4, 3, 8, 8}));  // running statistics and num_batches_tracked move
  torch::NoGradGuard no_grad;
  for (auto& p : net->parameters()) p.uniform_(0.5, 1.5);
  child<torch::nn::BatchNorm2dImpl>(*net, 1)->bias.set_requires_grad(false);
  child<torch::nn::SequentialImpl>(*net, 3)->ptr(2)->eval();
  return net;
}

TEST(ConvertSyncBatchNorm, ConvertsContainersAndKeepsStateAndForward) {
  auto net = small_net();
  auto original = small_net();
  const auto x = torch::randn({4, 3, 8, 8});
  run_thread_world(1, [&](World& world) {
    EXPECT_EQ(cohort::ddp::convert_sync_batchnorm(net.ptr(), world.group()), 2);
    auto sync2d = child<SyncBatchNormImpl>(*net, 1);
    auto sync1d = child<SyncBatchNormImpl>(*child<torch::nn::SequentialImpl>(*net, 3), 2);
    ASSERT_TRUE(sync2d && sync1d);
    EXPECT_FALSE(sync2d->bias.requires_grad());
    EXPECT_TRUE(sync2d->weight.requires_grad());
    EXPECT_TRUE(sync2d->is_training());
    EXPECT_FALSE(sync1d->is_training());

    // Same names, same values: state dicts interchange.
    auto params = net->named_parameters();
    auto buffers = net->named_buffers();
    ASSERT_EQ(params.keys(), original->named_parameters().keys());
    ASSERT_EQ(buffers.keys(), original->named_buffers().keys());
    for (const auto& item : original->named_parameters()) EXPECT_TRUE(torch::equal(item.value(), params[item.key()]));
    for (const auto& item : original->named_buffers())
      EXPECT_TRUE(torch::equal(item.value(), buffers[item.key()])) << item.key();

    // The containers' forward runs the new layers.
    net->train();
    original->train();
    EXPECT_TRUE(close(net->forward(x), original->forward(x)));
    EXPECT_EQ(sync2d->num_batches_tracked.item<std::int64_t>(), 2);
    auto original1d = child<torch::nn::BatchNorm1dImpl>(*child<torch::nn::SequentialImpl>(*original, 3), 2);
    EXPECT_TRUE(close(sync1d->running_var, original1d->running_var));
  });
}

TEST(ConvertSyncBatchNorm, ModuleListsAndModuleDictsToo) {
  torch::nn::ModuleList list(torch::nn::Linear(2, 2), torch::nn::BatchNorm1d(2));
  EXPECT_EQ(cohort::ddp::convert_sync_batchnorm(list.ptr(), cohort::comm::Group()), 1);
  EXPECT_TRUE(list->ptr(1)->as<SyncBatchNormImpl>());
  EXPECT_TRUE(list->named_children()["1"]->as<SyncBatchNormImpl>());

  torch::nn::ModuleDict dict(std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>{
      {"norm", torch::nn::BatchNorm3d(2).ptr()}, {"list", list.ptr()}});
  EXPECT_EQ(cohort::ddp::convert_sync_batchnorm(dict.ptr(), cohort::comm::Group()), 1);
  EXPECT_TRUE(dict["norm"]->as<SyncBatchNormImpl>());
  EXPECT_TRUE(dict->named_children()["norm"]->as<SyncBatchNormImpl>());
}

struct Block : torch::nn::Module {
  Block() { bn = register_module("bn", torch::nn::BatchNorm2d(4)); }
  at::Tensor forward(const at::Tensor& x) { return bn(x); }
  torch::nn::BatchNorm2d bn{nullptr};
};

TEST(ConvertSyncBatchNorm, BatchNormInAFieldIsAConfigErrorNamingItsPath) {
  auto net = torch::nn::Sequential(torch::nn::BatchNorm2d(4), std::make_shared<Block>());
  auto message = error_of([&] { cohort::ddp::convert_sync_batchnorm(net.ptr(), cohort::comm::Group()); });
  EXPECT_NE(message.find("'1.bn'"), std::string::npos) << message;
  EXPECT_NE(message.find("cohort::ddp::SyncBatchNorm"), std::string::npos) << message;
  EXPECT_TRUE(child<torch::nn::BatchNorm2dImpl>(*net, 0)) << "nothing may change when one layer cannot";
  EXPECT_THROW(cohort::ddp::convert_sync_batchnorm(torch::nn::BatchNorm1d(2).ptr(), cohort::comm::Group()),
               cohort::ConfigError);
}

}  // namespace
