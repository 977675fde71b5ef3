// ZeRO-1's pieces in one process: the balanced partition (Note [Balanced
// partition]), the state-bytes count, and ShardedOptimizer's refusals, with ranks as
// threads. The parity with DDP runs in real processes (tests/multiproc/zero_test.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>

#include "cohort/errors.h"
#include "cohort/zero/partition.h"
#include "cohort/zero/sharded_optimizer.h"
#include "cohort/zero/state_bytes.h"
#include "support/thread_world.h"

namespace {
using cohort::zero::partition_by_size;

std::vector<std::int64_t> loads(const std::vector<std::int64_t>& bytes, const std::vector<int>& owner, int n) {
  std::vector<std::int64_t> load(static_cast<std::size_t>(n), 0);
  for (std::size_t i = 0; i < bytes.size(); ++i) load[static_cast<std::size_t>(owner[i])] += bytes[i];
  return load;
}

TEST(ZeroPartition, LargestFirstToTheLightestRank) {
  // 40 to rank 0, 30 to 1, 20 to 2; then 10 to rank 2 (20, the lightest); then 5 to
  // rank 1 (30, tied with rank 2: the lower rank).
  const std::vector<std::int64_t> bytes = {10, 40, 5, 30, 20};
  EXPECT_EQ(partition_by_size(bytes, 3), (std::vector<int>{2, 0, 1, 1, 2}));
  EXPECT_EQ(partition_by_size(bytes, 1), (std::vector<int>(5, 0)));
  // More ranks than parameters: some own nothing.
  EXPECT_EQ(partition_by_size({7, 9}, 4), (std::vector<int>{1, 0}));
}

TEST(ZeroPartition, NoRankOwnsMoreThanTheAverageAndTheLargestParameter) {
  torch::manual_seed(3);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 2 + trial % 5;
    std::vector<std::int64_t> bytes;
    for (int i = 0; i < 3 + trial; ++i) bytes.push_back(torch::randint(1, 100000, {1}).item<std::int64_t>());
    auto owner = partition_by_size(bytes, n);
    const auto total = std::accumulate(bytes.begin(), bytes.end(), std::int64_t{0});
    const auto largest = *std::max_element(bytes.begin(), bytes.end());
    for (auto load : loads(bytes, owner, n)) EXPECT_LE(load, total / n + largest);
    EXPECT_EQ(owner, partition_by_size(bytes, n)) << "not deterministic";
  }
}

TEST(ZeroStateBytes, CountsEveryStateTensor) {
  auto w = torch::randn({10, 3}, torch::requires_grad());
  auto b = torch::randn({3}, torch::requires_grad());
  torch::optim::Adam adam({w, b}, torch::optim::AdamOptions(0.1));
  EXPECT_EQ(cohort::zero::optimizer_state_bytes(adam), 0);
  (w.sum() + b.sum()).backward();
  adam.step();
  EXPECT_EQ(cohort::zero::optimizer_state_bytes(adam), 2 * (30 + 3) * 4);
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1).momentum(0.9));
  sgd.step();
  EXPECT_EQ(cohort::zero::optimizer_state_bytes(sgd), 30 * 4);
}

cohort::zero::OptimizerFactory sgd() {
  return [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9));
  };
}

TEST(ZeroShardedOptimizer, SavingWithoutGatheringFirstSaysWhatToDo) {
  cohort::testing::run_thread_world(2, [](cohort::comm::World& world) {
    auto w = torch::zeros({4, 4}, torch::requires_grad());
    auto b = torch::zeros({4}, torch::requires_grad());
    cohort::zero::ShardedOptimizer opt({w, b, w}, world.group(), sgd());
    EXPECT_EQ(opt.param_groups()[0].params().size(), 2u) << "a parameter given twice counts once";
    EXPECT_EQ(opt.owner(0), 0);
    EXPECT_EQ(opt.owner(1), 1);
    torch::serialize::OutputArchive archive;
    try {
      opt.save(archive);
      ADD_FAILURE() << "saved a state spread over two ranks";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("call gather_state("), std::string::npos) << e.what();
    }
    EXPECT_THROW(opt.gather_state(2), cohort::ConfigError);
  });
}

TEST(ZeroShardedOptimizer, ASchedulersLearningRateReachesEveryShard) {
  cohort::testing::run_thread_world(2, [](cohort::comm::World& world) {
    auto w = torch::ones({8}, torch::requires_grad());
    auto b = torch::ones({8}, torch::requires_grad());
    cohort::zero::ShardedOptimizer opt({w, b}, world.group(), [](std::vector<torch::Tensor> p) {
      return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(1.0));
    });
    torch::optim::StepLR schedule(opt, /*step_size=*/1, /*gamma=*/0.5);
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      (w.sum() + b.sum()).backward();
      opt.step();
      schedule.step();
    }
    // LibTorch's StepLR leaves its first step() alone: the steps ran at 1, 1 and 0.5,
    // so 1 - 1 - 1 - 0.5 on every element of both, whoever owns them.
    EXPECT_TRUE(torch::allclose(w, torch::full({8}, -1.5))) << w;
    EXPECT_TRUE(torch::allclose(b, torch::full({8}, -1.5))) << b;
    EXPECT_DOUBLE_EQ(opt.lr(), 0.25);
  });
}

TEST(ZeroShardedOptimizer, ABadBucketCapOrFactoryIsRefused) {
  auto w = torch::zeros({4}, torch::requires_grad());
  cohort::testing::run_thread_world(1, [&](cohort::comm::World& world) {
    EXPECT_THROW(cohort::zero::ShardedOptimizer({w}, world.group(), sgd(),
                                                cohort::zero::ShardedOptimizerOptions().bucket_cap_bytes(0)),
                 cohort::ConfigError);
    EXPECT_THROW(cohort::zero::ShardedOptimizer({w}, world.group(), nullptr), cohort::ConfigError);
    EXPECT_THROW(cohort::zero::ShardedOptimizer({w}, world.group(),
                                                [](std::vector<torch::Tensor> p) {
                                                  return std::make_unique<torch::optim::LBFGS>(p);
                                                }),
                 cohort::ConfigError);
  });
}

}  // namespace
