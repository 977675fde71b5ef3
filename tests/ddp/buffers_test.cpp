// When DDP broadcasts buffers (Note [When buffers are synchronised]): before the
// first forward after a synchronised training forward, never before evaluation
// forwards that follow one another, so ranks may evaluate different numbers of
// batches.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/ddp/distributed_data_parallel.h"
#include "support/thread_world.h"

namespace {
using cohort::ddp::DistributedDataParallel;
using cohort::testing::run_thread_world;
using namespace std::chrono_literals;

struct NormedImpl : torch::nn::Cloneable<NormedImpl> {
  NormedImpl() { reset(); }
  void reset() override {
    lin = register_module("lin", torch::nn::Linear(4, 4));
    bn = register_module("bn", torch::nn::BatchNorm1d(4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return bn(lin(x)); }
  torch::nn::Linear lin{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Normed);

TEST(DdpBuffers, RanksMayEvaluateDifferentNumbersOfBatchesUnderNoGrad) {
  torch::manual_seed(0);
  Normed reference;
  auto train = torch::randn({2, 5, 4});
  auto eval = torch::randn({3, 3, 4});
  // A short timeout: a hang here is the defect, and should fail fast.
  auto options = cohort::testing::quick_thread_world_options().timeout(5s);
  run_thread_world(
      2,
      [&](cohort::comm::World& world) {
        const int r = world.rank();
        auto model = std::dynamic_pointer_cast<NormedImpl>(reference->clone());
        DistributedDataParallel ddp(Normed(model), world.group());
        ddp(train[r] + r).sum().backward();  // running statistics now differ per rank
        ddp.module()->eval();
        {
          torch::NoGradGuard no_grad;
          ddp(eval[0]);
          // The first forward after the training step took rank 0's statistics.
          auto both = world.group().all_gather(model->bn->running_mean.clone());
          EXPECT_TRUE(torch::equal(both[0], both[1])) << "rank " << r;
          if (r == 0)  // rank 0 has two more evaluation batches than rank 1
            for (int i = 1; i < 3; ++i) ddp(eval[i]);
        }
        // Every rank's next collective pairs with the others' (no buffer broadcast
        // left over from rank 0's extra batches).
        auto t = torch::ones({1});
        world.group().all_reduce(t);
        EXPECT_EQ(t.item<float>(), 2.0f) << "rank " << r;
      },
      options);
}

}  // namespace
