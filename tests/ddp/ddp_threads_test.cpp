// DDP mechanics with ranks as threads: hooks, buckets, rebuild, views, and the
// errors a misuse gets. Parity across real processes is in tests/multiproc.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "support/thread_world.h"

namespace {
using cohort::ddp::DistributedDataParallel;
using cohort::ddp::DistributedDataParallelOptions;
using cohort::testing::run_thread_world;

torch::nn::Sequential mlp() {
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
}

// The gradients of `model` on `x` against target 0, as a single process computes them.
std::vector<torch::Tensor> local_grads(torch::nn::Sequential model, const torch::Tensor& x) {
  model->zero_grad();
  model->forward(x).pow(2).mean().backward();
  std::vector<torch::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.grad().clone());
  return out;
}

TEST(DdpThreads, WorldsOfOneAndTwoAverageGradientsLikeOneProcessOnTheWholeBatch) {
  torch::manual_seed(0);
  auto reference = mlp();
  auto x = torch::randn({8, 6});
  auto expected = local_grads(reference, x);
  for (auto [n, view] : {std::pair{1, false}, {1, true}, {2, false}, {2, true}}) {
    run_thread_world(n, [&, n = n, view = view](cohort::comm::World& world) {
      auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
      DistributedDataParallel ddp(torch::nn::Sequential(model), world.group(),
                                  DistributedDataParallelOptions().gradient_as_bucket_view(view).bucket_cap_bytes(64));
      for (int step = 0; step < 3; ++step) {  // the second forward rebuilds the buckets
        ddp.module()->zero_grad();
        ddp(x.chunk(n)[world.rank()]).pow(2).mean().backward();
        auto params = ddp.module()->parameters();
        for (std::size_t i = 0; i < params.size(); ++i)
          EXPECT_TRUE(torch::allclose(params[i].grad(), expected[i], 1e-5, 1e-6))
              << "world " << n << " view " << view << " step " << step << " param " << i;
      }
      EXPECT_TRUE(ddp.reducer().rebuilt());
    });
  }
}

// Note [Bucket views keep the parameter's layout]: channels-last convolution weights
// average like any others, their gradients keep the parameter's layout, and under
// gradient_as_bucket_view they alias the bucket.
TEST(DdpThreads, ChannelsLastWeightsAverageAndKeepTheirLayout) {
  torch::manual_seed(0);
  auto conv = [] { return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)),
                                                torch::nn::Flatten(), torch::nn::Linear(4 * 4 * 4, 2)); };
  auto reference = conv();
  auto x = torch::randn({4, 3, 6, 6}).contiguous(torch::MemoryFormat::ChannelsLast);
  auto expected = local_grads(reference, x);
  for (bool view : {false, true}) {
    run_thread_world(2, [&](cohort::comm::World& world) {
      auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
      auto& weight = model->ptr<torch::nn::Conv2dImpl>(0)->weight;
      {
        torch::NoGradGuard no_grad;
        weight.set_data(weight.data().contiguous(torch::MemoryFormat::ChannelsLast));
      }
      DistributedDataParallel ddp(torch::nn::Sequential(model), world.group(),
                                  DistributedDataParallelOptions().gradient_as_bucket_view(view));
      for (int step = 0; step < 2; ++step) {
        ddp.module()->zero_grad();
        ddp(x.chunk(2)[world.rank()]).pow(2).mean().backward();
        auto params = ddp.module()->parameters();
        for (std::size_t i = 0; i < params.size(); ++i)
          EXPECT_TRUE(torch::allclose(params[i].grad(), expected[i], 1e-5, 1e-6)) << "view " << view << " param " << i;
        EXPECT_TRUE(weight.grad().is_contiguous(torch::MemoryFormat::ChannelsLast)) << "view " << view;
      }
    });
  }
}

// A layer that only rank 0 uses: the other ranks contribute zeros to its average.
struct BranchyImpl : torch::nn::Cloneable<BranchyImpl> {
  BranchyImpl() { reset(); }
  void reset() override {
    trunk = register_module("trunk", torch::nn::Linear(6, 6));
    branch = register_module("branch", torch::nn::Linear(6, 6));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_branch) {
    auto h = trunk(x);
    return use_branch ? branch(h) : h;
  }
  torch::nn::Linear trunk{nullptr}, branch{nullptr};
};
TORCH_MODULE(Branchy);

TEST(DdpThreads, FindUnusedAveragesALayerOnlyOneRankUsedWithZerosFromTheOthers) {
  torch::manual_seed(1);
  Branchy reference;
  auto x = torch::randn({2, 4, 6});
  std::vector<torch::Tensor> expected;
  for (int q = 0; q < 2; ++q) {
    reference->zero_grad();
    reference->forward(x[q], q == 0).pow(2).sum().backward();
    auto params = reference->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto g = params[i].grad().defined() ? params[i].grad().clone() : torch::zeros_like(params[i]);
      if (q == 0) expected.push_back(g / 2);
      else expected[i] += g / 2;
    }
  }
  run_thread_world(2, [&](cohort::comm::World& world) {
    auto model = std::dynamic_pointer_cast<BranchyImpl>(reference->clone());
    DistributedDataParallel ddp(Branchy(model), world.group(),
                                DistributedDataParallelOptions().find_unused_parameters(true).bucket_cap_bytes(100));
    for (int step = 0; step < 2; ++step) {
      ddp.module()->zero_grad();
      ddp(x[world.rank()], world.rank() == 0).pow(2).sum().backward();
      auto params = ddp.module()->parameters();
      for (std::size_t i = 0; i < params.size(); ++i)
        EXPECT_TRUE(torch::allclose(params[i].grad(), expected[i], 1e-5, 1e-6)) << "rank " << world.rank() << " param " << i;
    }
  });
}

TEST(DdpThreads, ABackwardThatFailedMidwayDoesNotStopLaterStepsFromSynchronising) {
  torch::manual_seed(2);
  auto reference = mlp();
  auto x = torch::randn({8, 6});
  auto expected = local_grads(reference, x);
  run_thread_world(2, [&](cohort::comm::World& world) {
    auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
    DistributedDataParallel ddp(torch::nn::Sequential(model), world.group());
    // The input's gradient comes last, after some parameters' hooks have fired.
    auto input = x.chunk(2)[world.rank()].clone().requires_grad_(true);
    input.register_hook([](torch::Tensor) -> torch::Tensor { throw std::runtime_error("skip this batch"); });
    EXPECT_THROW(ddp(input).pow(2).mean().backward(), std::exception);
    ddp.module()->zero_grad();
    ddp(x.chunk(2)[world.rank()]).pow(2).mean().backward();
    auto params = ddp.module()->parameters();
    for (std::size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(torch::allclose(params[i].grad(), expected[i], 1e-5, 1e-6)) << "param " << i;
  });
}

TEST(DdpThreads, GradientAsBucketViewLeavesNoSeparateGradientStorage) {
  run_thread_world(1, [&](cohort::comm::World& world) {
    DistributedDataParallel ddp(mlp(), world.group(), DistributedDataParallelOptions().gradient_as_bucket_view(true));
    for (int step = 0; step < 2; ++step) {
      ddp(torch::randn({4, 6})).sum().backward();
      // Every .grad shares storage with some other parameter's .grad: they live in buckets.
      auto params = ddp.module()->parameters();
      for (auto& p : params) {
        int sharing = 0;
        for (auto& q : params) sharing += p.grad().is_alias_of(q.grad()) ? 1 : 0;
        EXPECT_GE(sharing, 2);
      }
    }
  });
}

TEST(DdpThreads, UnusedParameterWithoutFindUnusedIsNamedAtThatStep) {
  run_thread_world(2, [&](cohort::comm::World& world) {
    auto model = mlp();
    DistributedDataParallel ddp(model, world.group());
    auto out = ddp(torch::randn({4, 6}));
    // The loss ignores the last layer's bias... no: it uses an intermediate instead.
    auto first = ddp.module()[0]->as<torch::nn::Linear>();
    auto partial = first->forward(torch::randn({4, 6})).sum();
    try {
      partial.backward();
      FAIL() << "expected an error naming the parameters without gradient";
    } catch (const std::exception& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("2.weight"), std::string::npos) << what;
      EXPECT_NE(what.find("find_unused_parameters(true)"), std::string::npos) << what;
    }
    (void)out;
  });
}

TEST(DdpThreads, SecondBackwardOverOneForwardIsRefused) {
  run_thread_world(1, [&](cohort::comm::World& world) {
    DistributedDataParallel ddp(mlp(), world.group());
    auto loss = ddp(torch::randn({4, 6})).sum();
    loss.backward({}, /*retain_graph=*/true);
    try {
      loss.backward();
      FAIL() << "expected an error";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("outside a DDP step"), std::string::npos) << e.what();
    }
  });
}

TEST(DdpThreads, InputOnAnotherDeviceIsNamedWithBothDevices) {
  run_thread_world(1, [&](cohort::comm::World& world) {
    DistributedDataParallel ddp(mlp(), world.group());
    try {
      ddp(torch::empty({4, 6}, torch::kMeta));
      FAIL() << "expected an error";
    } catch (const cohort::ConfigError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("meta"), std::string::npos) << what;
      EXPECT_NE(what.find("cpu"), std::string::npos) << what;
    }
  });
}

// Note [The trainable set is fixed at construction]: unfreezing or adding a
// parameter after wrapping would let the ranks drift apart; the next training
// forward refuses it on every rank, naming the parameter. Freezing is allowed.
TEST(DdpThreads, ParameterUnfrozenOrAddedAfterConstructionIsRefusedAtTheNextForward) {
  for (std::string change : {"unfreeze", "add"}) {
    run_thread_world(2, [&](cohort::comm::World& world) {
      auto model = mlp();
      auto first = model[0]->as<torch::nn::Linear>();
      if (change == "unfreeze") first->weight.requires_grad_(false);
      DistributedDataParallel ddp(model, world.group(), DistributedDataParallelOptions().find_unused_parameters(true));
      ddp(torch::randn({4, 6})).sum().backward();  // a step before the change is fine
      if (change == "unfreeze") first->weight.requires_grad_(true);
      else first->register_parameter("extra", torch::ones({8}));
      {
        torch::NoGradGuard no_grad;  // evaluation trains nothing: not checked
        ddp(torch::randn({4, 6}));
      }
      try {
        ddp(torch::randn({4, 6})).sum().backward();
        FAIL() << change << ": expected the changed trainable set to be refused";
      } catch (const cohort::ConfigError& e) {
        std::string what = e.what();
        EXPECT_NE(what.find(change == "unfreeze" ? "'0.weight'" : "'0.extra'"), std::string::npos) << what;
        EXPECT_NE(what.find("construct the DistributedDataParallel wrapper again"), std::string::npos) << what;
      }
    });
  }
  run_thread_world(2, [&](cohort::comm::World& world) {  // freezing a reduced parameter: allowed
    auto model = mlp();
    DistributedDataParallel ddp(model, world.group(), DistributedDataParallelOptions().find_unused_parameters(true));
    ddp(torch::randn({4, 6})).sum().backward();
    model[0]->as<torch::nn::Linear>()->weight.requires_grad_(false);
    EXPECT_NO_THROW(ddp(torch::randn({4, 6})).sum().backward());
  });
}

TEST(DdpThreads, NonPositiveBucketCapIsAConfigError) {
  run_thread_world(1, [&](cohort::comm::World& world) {
    EXPECT_THROW(DistributedDataParallel(mlp(), world.group(), DistributedDataParallelOptions().bucket_cap_bytes(0)),
                 cohort::ConfigError);
  });
}

}  // namespace

namespace {

// Note [Join]'s round, without a group: the sum of what ranks 1 and 3 of 4 send.
TEST(JoinRound, DecodesTheActiveRanksAndFlagsOfASummedRound) {
  auto sum = cohort::ddp::encode_join_round(4, 1, true, true, false, false) +
             cohort::ddp::encode_join_round(4, 3, true, true, true, true) +
             cohort::ddp::encode_join_round(4, 0, /*active=*/false, true, true, true);
  auto round = cohort::ddp::decode_join_round(sum, 4);
  EXPECT_EQ(round.active_ranks, (std::vector<int>{1, 3}));
  EXPECT_EQ(round.authoritative(), 3);
  EXPECT_TRUE(round.grad_enabled);
  EXPECT_TRUE(round.sync);
  EXPECT_TRUE(round.sync_buffers);
  auto done = cohort::ddp::decode_join_round(cohort::ddp::encode_join_round(4, 2, false, true, true, true), 4);
  EXPECT_EQ(done.active(), 0);
  EXPECT_FALSE(done.sync);
  EXPECT_FALSE(done.sync_buffers);
}

}  // namespace
