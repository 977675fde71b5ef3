// ZeRO-2's gradients (Note [ZeRO-2 gradients]) with ranks as threads: where each
// gradient lives, what it holds after accumulation and no_sync, and the refusals.
// The parity with DDP over real processes is tests/multiproc/zero_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "cohort/zero/sharded_optimizer.h"
#include "support/thread_world.h"
#include "support/unused_parameters.h"

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

// Note [Unused parameters under ZeRO-2]: a parameter no rank used this step is
// skipped by the optimizer, as one process skips it; one that a single rank used
// is averaged. AdamW with weight decay would move a zero gradient's parameter.
struct UnusedNet {
  std::vector<torch::Tensor> params;  // body.w, body.b, head, aux (never used), late
  UnusedNet() {
    torch::manual_seed(3);
    for (auto shape : std::vector<std::vector<std::int64_t>>{{8, 6}, {8}, {3, 8}, {3, 8}, {3, 8}})
      params.push_back((torch::randn(shape) * 0.3).set_requires_grad(true));
  }
  // `late` joins on rank 0 at step 1 and on every rank from step 2.
  static bool late_used(int rank, int step) { return step >= 2 || (step == 1 && rank == 0); }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y, bool late) const {
    auto h = torch::tanh(torch::addmm(params[1], x, params[0].t()));
    auto out = h.mm(params[2].t());
    if (late) out = out + h.mm(params[4].t());
    return torch::mse_loss(out, y);
  }
};

using cohort::testing::adamw;

TEST(ZeroGradientSharder, AParameterNoRankUsedIsSkippedAsInOneProcess) {
  constexpr int kWorld = 2, kRows = 3, kSteps = 4;
  const cohort::testing::StepBatches batches(kSteps, kWorld, kRows);
  // One process: the mean of the ranks' losses, one AdamW over every parameter.
  UnusedNet ref;
  auto opt = adamw(ref.params);
  for (int s = 0; s < kSteps; ++s) {
    opt->zero_grad();
    torch::Tensor loss = torch::zeros({});
    for (int r = 0; r < kWorld; ++r)
      loss = loss + ref.loss(batches.x(s, r), batches.y(s, r), UnusedNet::late_used(r, s)) / kWorld;
    loss.backward();
    opt->step();
  }
  std::vector<UnusedNet> nets(kWorld);
  cohort::testing::run_thread_world(kWorld, [&](cohort::comm::World& world) {
    const int r = world.rank();
    auto& net = nets[r];
    ShardedOptimizer o(net.params, world.group(), adamw, ShardedOptimizerOptions().shard_gradients(true));
    for (int s = 0; s < kSteps; ++s) {
      o.zero_grad();
      net.loss(batches.x(s, r), batches.y(s, r), UnusedNet::late_used(r, s)).backward();
      o.step();
    }
  });
  const char* names[] = {"body.w", "body.b", "head", "aux (never used)", "late"};
  for (int r = 0; r < kWorld; ++r)
    for (std::size_t i = 0; i < ref.params.size(); ++i)
      EXPECT_TRUE(torch::allclose(nets[r].params[i], ref.params[i], 1e-5, 1e-6))
          << names[i] << " on rank " << r << " differs from one process by "
          << (nets[r].params[i] - ref.params[i]).abs().max().item<double>();
}

// Note [Unfreezing after construction]: the owner would step the unfrozen parameter
// with its own gradient, not the average; refused under ZeRO-1 and ZeRO-2 alike.
TEST(ZeroGradientSharder, UnfreezingAfterConstructionIsRefusedUnderZero1And2) {
  for (bool zero2 : {false, true}) {
    cohort::testing::run_thread_world(2, [&](cohort::comm::World& world) {
      torch::manual_seed(1);
      auto model = torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Linear(8, 2));
      for (auto& p : model[0]->parameters()) p.set_requires_grad(false);  // a frozen body
      std::unique_ptr<cohort::ddp::DistributedDataParallel<torch::nn::Sequential>> ddp;
      if (!zero2) ddp = std::make_unique<cohort::ddp::DistributedDataParallel<torch::nn::Sequential>>(model, world.group());
      ShardedOptimizer opt(model->parameters(), world.group(), adamw,
                           ShardedOptimizerOptions().shard_gradients(zero2));
      auto x = torch::full({3, 6}, world.rank() + 1.0);
      auto forward = [&] { return zero2 ? model->forward(x) : (*ddp)(x); };
      opt.zero_grad();
      forward().sum().backward();
      EXPECT_NO_THROW(opt.step());
      for (auto& p : model[0]->parameters()) p.set_requires_grad(true);  // fine-tuning: unfrozen
      opt.zero_grad();
      try {
        // Under ZeRO-1 the DDP wrapper refuses first, at the forward; under ZeRO-2,
        // which has no wrapper, the sharded optimizer refuses at its step.
        forward().sum().backward();
        opt.step();
        ADD_FAILURE() << (zero2 ? "ZeRO-2" : "ZeRO-1") << " stepped a parameter unfrozen after construction";
      } catch (const cohort::ConfigError& e) {
        const std::string what = e.what();
        if (zero2) {
          EXPECT_NE(what.find("parameter 0 (shape [8, 6]) was frozen"), std::string::npos) << what;
          EXPECT_NE(what.find("set requires_grad on every parameter before"), std::string::npos) << what;
        } else {
          EXPECT_NE(what.find("the set of trainable parameters changed after DDP was constructed"),
                    std::string::npos) << what;
        }
      }
    });
  }
}

}  // namespace
