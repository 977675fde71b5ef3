// ZeRO-2's gradients (Note [ZeRO-2 gradients]) with ranks as threads: where each
// gradient lives, what it holds after accumulation and no_sync, and the refusals.
// The parity with DDP over real processes is tests/multiproc/zero_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "cohort/zero/sharded_optimizer.h"
#include "support/thread_world.h"

namespace {
using cohort::zero::ShardedOptimizer;
using cohort::zero::ShardedOptimizerOptions;

cohort::zero::OptimizerFactory sgd(double lr = 0.1) {
  return [lr](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(lr));
  };
}

// w (32 elements) goes to rank 0, b (4) to rank 1 (Note [Balanced partition]).
struct Params {
  torch::Tensor w = torch::zeros({8, 4}, torch::requires_grad());
  torch::Tensor b = torch::zeros({4}, torch::requires_grad());
  torch::Tensor frozen = torch::ones({4});
  // Rank r's gradient is r + 1 in every element of w and b: the average over two
  // ranks is 1.5 per backward.
  void backward(int rank) const { ((w.sum() + b.sum() + frozen.sum()) * (rank + 1)).backward(); }
};

TEST(ZeroGradientSharder, EachGradientLivesOnItsOwnerAndHoldsTheAverage) {
  cohort::testing::run_thread_world(2, [](cohort::comm::World& world) {
    Params p;
    ShardedOptimizer opt({p.w, p.b, p.frozen}, world.group(), sgd(), ShardedOptimizerOptions().shard_gradients(true));
    ASSERT_NE(opt.gradient_sharder(), nullptr);
    p.backward(world.rank());
    const auto& mine = world.rank() == 0 ? p.w : p.b;
    const auto& theirs = world.rank() == 0 ? p.b : p.w;
    ASSERT_TRUE(mine.grad().defined());
    EXPECT_TRUE(torch::equal(mine.grad(), torch::full_like(mine, 1.5))) << mine.grad();
    EXPECT_FALSE(theirs.grad().defined()) << "rank " << world.rank() << " keeps a gradient it does not own";
    EXPECT_FALSE(p.frozen.grad().defined());
    EXPECT_EQ(opt.gradient_sharder()->local_gradient_bytes(), static_cast<std::int64_t>(mine.nbytes()));
    // A second synchronised backward adds its average, as under DDP.
    p.backward(world.rank());
    EXPECT_TRUE(torch::equal(mine.grad(), torch::full_like(mine, 3.0))) << mine.grad();
    opt.step();  // lr 0.1: every element of both moves by -0.3, on every rank
    EXPECT_TRUE(torch::allclose(p.w, torch::full_like(p.w, -0.3))) << p.w;
    EXPECT_TRUE(torch::allclose(p.b, torch::full_like(p.b, -0.3))) << p.b;
  });
}

TEST(ZeroGradientSharder, NoSyncAccumulatesLocallyAndTheNextBackwardSendsTheSum) {
  cohort::testing::run_thread_world(2, [](cohort::comm::World& world) {
    Params p;
    ShardedOptimizer opt({p.w, p.b}, world.group(), sgd(), ShardedOptimizerOptions().shard_gradients(true));
    const auto& mine = world.rank() == 0 ? p.w : p.b;
    const auto& theirs = world.rank() == 0 ? p.b : p.w;
    for (int round = 0; round < 2; ++round) {
      opt.zero_grad();
      {
        auto guard = opt.no_sync();
        p.backward(world.rank());
        // Local, full size, on every rank: this rank's own gradient only.
        EXPECT_TRUE(torch::equal(theirs.grad(), torch::full_like(theirs, world.rank() + 1.0))) << theirs.grad();
      }
      p.backward(world.rank());
      // The average of two backwards: (2 + 4) / 2.
      EXPECT_TRUE(torch::equal(mine.grad(), torch::full_like(mine, 3.0))) << "round " << round << mine.grad();
      EXPECT_FALSE(theirs.grad().defined());
      opt.step();
    }
  });
}

// An average left in .grad would be divided and summed again by the next
// synchronised backward, and no later zero_grad could tell it from the local sum.
TEST(ZeroGradientSharder, NoSyncOnTopOfAnUnclearedAverageIsRefused) {
  cohort::testing::run_thread_world(2, [](cohort::comm::World& world) {
    Params p;
    ShardedOptimizer opt({p.w, p.b}, world.group(), sgd(), ShardedOptimizerOptions().shard_gradients(true));
    p.backward(world.rank());
    {
      auto guard = opt.no_sync();
      try {
        p.backward(world.rank());
        ADD_FAILURE() << "no_sync accumulated on top of an average";
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("Call zero_grad()"), std::string::npos) << e.what();
      }
    }
    opt.zero_grad();
    p.backward(world.rank());
    const auto& mine = world.rank() == 0 ? p.w : p.b;
    EXPECT_TRUE(torch::equal(mine.grad(), torch::full_like(mine, 1.5))) << mine.grad();
  });
}

// Throws in backward, after the other parameter's gradient was taken.
struct FailingBackward : torch::autograd::Function<FailingBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list) {
    throw std::runtime_error("a failing backward");
  }
};

// Note [An abandoned backward]: every rank's backward fails at the same point; the
// next one is whole again.
TEST(ZeroGradientSharder, ABackwardThatFailedPartWayDoesNotPoisonTheNext) {
  cohort::testing::run_thread_world(2, [](cohort::comm::World& world) {
    Params p;
    ShardedOptimizer opt({p.w, p.b}, world.group(), sgd(), ShardedOptimizerOptions().shard_gradients(true));
    for (int attempt = 0; attempt < 2; ++attempt) {
      auto failing = FailingBackward::apply(p.b).sum();
      EXPECT_THROW((failing + p.w.sum()).backward(), std::exception);
    }
    opt.zero_grad();
    p.backward(world.rank());
    const auto& mine = world.rank() == 0 ? p.w : p.b;
    EXPECT_TRUE(torch::equal(mine.grad(), torch::full_like(mine, 1.5))) << mine.grad();
    {
      auto guard = opt.no_sync();  // not "entered during a backward"
    }
    EXPECT_NO_THROW(opt.step());
  });
}

// Gradient clipping over the shards: the norm of the whole model's averaged
// gradients (36 elements of 1.5: 9), the same on every rank.
TEST(ZeroGradientSharder, ClippingSeesEveryRanksShard) {
  cohort::testing::run_thread_world(2, [](cohort::comm::World& world) {
    Params p;
    ShardedOptimizer opt({p.w, p.b}, world.group(), sgd(), ShardedOptimizerOptions().shard_gradients(true));
    p.backward(world.rank());
    EXPECT_NEAR(opt.clip_grad_norm(1.0), 9.0, 1e-9);
    const auto& mine = world.rank() == 0 ? p.w : p.b;
    EXPECT_TRUE(torch::allclose(mine.grad(), torch::full_like(mine, 1.5 / (9.0 + 1e-6)))) << mine.grad();
  });
}

TEST(ZeroGradientSharder, ParametersWithoutAGradientCountAsZeros) {
  cohort::testing::run_thread_world(2, [](cohort::comm::World& world) {
    Params p;
    ShardedOptimizer opt({p.w, p.b}, world.group(), sgd(), ShardedOptimizerOptions().shard_gradients(true));
    // Rank 1 leaves b out of its loss: b's average is (1 + 0) / 2.
    if (world.rank() == 0) p.backward(0);
    else (p.w.sum() * 2).backward();
    const auto& mine = world.rank() == 0 ? p.w : p.b;
    EXPECT_TRUE(torch::equal(mine.grad(), torch::full_like(mine, world.rank() == 0 ? 1.5 : 0.5))) << mine.grad();
  });
}

TEST(ZeroGradientSharder, UnderDdpTooTheStepSaysSo) {
  cohort::testing::run_thread_world(2, [](cohort::comm::World& world) {
    torch::manual_seed(1);
    auto model = torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Linear(8, 2));
    cohort::ddp::DistributedDataParallel<torch::nn::Sequential> ddp(model, world.group());
    ShardedOptimizer opt(model->parameters(), world.group(), sgd(), ShardedOptimizerOptions().shard_gradients(true));
    ddp(torch::ones({3, 6})).sum().backward();
    try {
      opt.step();
      ADD_FAILURE() << "stepped gradients that DDP wrote on a rank that does not own them";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("do not also wrap the model in DDP"), std::string::npos) << e.what();
    }
  });
}

TEST(ZeroGradientSharder, NoSyncWithoutShardedGradientsPointsToDdp) {
  auto w = torch::zeros({4}, torch::requires_grad());
  cohort::testing::run_thread_world(1, [&](cohort::comm::World& world) {
    ShardedOptimizer opt({w}, world.group(), sgd());
    EXPECT_EQ(opt.gradient_sharder(), nullptr);
    try {
      auto guard = opt.no_sync();
      ADD_FAILURE() << "no_sync() without shard_gradients";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("DDP wrapper's no_sync()"), std::string::npos) << e.what();
    }
  });
}

// The replicas start equal without DDP: rank 0's values reach every rank.
TEST(ZeroGradientSharder, RankZerosParametersReachEveryRank) {
  cohort::testing::run_thread_world(3, [](cohort::comm::World& world) {
    auto w = torch::full({5}, static_cast<float>(world.rank() + 7), torch::requires_grad());
    ShardedOptimizer opt({w}, world.group(), sgd(), ShardedOptimizerOptions().shard_gradients(true));
    EXPECT_TRUE(torch::equal(w, torch::full({5}, 7.0f))) << w;
  });
}

}  // namespace
