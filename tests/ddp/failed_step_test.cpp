// A backward that throws part-way and is caught by the training loop (Note [A step
// that failed]): the next step synchronises exactly, whichever buckets each rank
// had in flight and however late the ranks fail, and no rank hangs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "ddp/reference.h"
#include "support/thread_world.h"

namespace {
using cohort::ddp::DistributedDataParallel;
using cohort::ddp::DistributedDataParallelOptions;
using cohort::testing::max_grad_error;
using cohort::testing::MidFail;
using cohort::testing::MidFailImpl;
using cohort::testing::run_thread_world;
using cohort::testing::throw_in_backward;
using namespace std::chrono_literals;

// Bounded well below ctest's limit, above the 1 s skew.
cohort::comm::InitOptions options() { return cohort::testing::quick_thread_world_options().timeout(10s); }

struct Layout {
  bool view;
  std::int64_t cap;  // 128: three buckets; 1: one per parameter
};

std::ostream& operator<<(std::ostream& os, const Layout& l) { return os << "view " << l.view << " cap " << l.cap; }

DistributedDataParallelOptions ddp_options(const Layout& l) {
  return DistributedDataParallelOptions()
      .gradient_as_bucket_view(l.view)
      .bucket_cap_bytes(l.cap)
      .first_bucket_cap_bytes(l.cap);
}

class FailedStep : public ::testing::TestWithParam<Layout> {};

// Both ranks throw from a hook on the input (its gradient comes after the
// parameters'), so every bucket is in flight; rank 1 fails a second later, so
// rank 0's reductions are still waiting for it when rank 0 starts the next step.
TEST_P(FailedStep, SkewedFailureOnEveryRankLeavesTheNextStepExact) {
  torch::manual_seed(2);
  auto reference = cohort::testing::small_mlp();
  auto x = torch::randn({8, 6});
  auto failing = torch::randn({8, 6});  // another batch, so that its sums cannot pass for the next step's
  auto expected = cohort::testing::mlp_grads(reference, x);
  run_thread_world(
      2,
      [&](cohort::comm::World& world) {
        auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
        DistributedDataParallel ddp(torch::nn::Sequential(model), world.group(), ddp_options(GetParam()));
        auto input = failing.chunk(2)[world.rank()].clone().requires_grad_(true);
        throw_in_backward(input);
        auto loss = ddp(input).pow(2).mean();
        if (world.rank() == 1) std::this_thread::sleep_for(1s);  // skew, not synchronisation
        EXPECT_THROW(loss.backward(), std::exception);
        for (int step = 0; step < 2; ++step) {
          ddp.module()->zero_grad();
          ddp(x.chunk(2)[world.rank()]).pow(2).mean().backward();
          EXPECT_LT(max_grad_error(ddp.module()->parameters(), expected), 1e-6)
              << "rank " << world.rank() << " step " << step;
        }
      },
      options());
}

INSTANTIATE_TEST_SUITE_P(Layouts, FailedStep,
                         ::testing::Values(Layout{false, 128}, Layout{true, 128}, Layout{false, 1}, Layout{true, 1}));

std::vector<torch::Tensor> mid_fail_grads(MidFail model, const torch::Tensor& x) {
  model->zero_grad();
  model->forward(x, false).pow(2).mean().backward();
  std::vector<torch::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.grad().clone());
  return out;
}

TEST(FailedStepPoints, RanksThatFailAtDifferentBucketsStayPaired) {
  torch::manual_seed(3);
  MidFail reference;
  auto x = torch::randn({8, 6});
  auto expected = mid_fail_grads(reference, x);
  run_thread_world(
      2,
      [&](cohort::comm::World& world) {
        auto model = std::dynamic_pointer_cast<MidFailImpl>(reference->clone());
        DistributedDataParallel ddp(MidFail(model), world.group(),
                                    DistributedDataParallelOptions().bucket_cap_bytes(1).first_bucket_cap_bytes(1));
        auto mine = x.chunk(2)[world.rank()];
        // Rank 0 fails between the layers (two of four buckets launched), rank 1 at
        // its input (after every parameter's gradient).
        auto input = (mine * 3).requires_grad_(true);
        if (world.rank() == 1) throw_in_backward(input);
        EXPECT_THROW(ddp(input, world.rank() == 0).pow(2).mean().backward(), std::exception);
        for (int step = 0; step < 2; ++step) {
          ddp.module()->zero_grad();
          ddp(mine, false).pow(2).mean().backward();
          EXPECT_LT(max_grad_error(ddp.module()->parameters(), expected), 1e-6)
              << "rank " << world.rank() << " step " << step;
        }
      },
      options());
}

TEST(FailedStepPoints, ARankWhoseBackwardSucceededIsToldThatAPeerFailed) {
  torch::manual_seed(4);
  MidFail reference;
  auto x = torch::randn({8, 6});
  auto expected = mid_fail_grads(reference, x);
  run_thread_world(
      2,
      [&](cohort::comm::World& world) {
        auto model = std::dynamic_pointer_cast<MidFailImpl>(reference->clone());
        DistributedDataParallel ddp(MidFail(model), world.group(),
                                    DistributedDataParallelOptions().bucket_cap_bytes(1).first_bucket_cap_bytes(1));
        auto mine = x.chunk(2)[world.rank()];
        auto loss = ddp(mine, /*fail_between_layers=*/world.rank() == 0).pow(2).mean();
        try {
          loss.backward();
          ADD_FAILURE() << "rank " << world.rank() << ": the step completed although rank 0's backward failed";
        } catch (const cohort::CommError& e) {
          EXPECT_EQ(world.rank(), 1) << e.what();
          std::string what = e.what();
          EXPECT_NE(what.find("rank 0"), std::string::npos) << what;
          EXPECT_NE(what.find("backward"), std::string::npos) << what;
        } catch (const std::exception& e) {
          EXPECT_EQ(world.rank(), 0) << e.what();
          EXPECT_NE(std::string(e.what()).find("skip this batch"), std::string::npos) << e.what();
        }
        ddp.module()->zero_grad();
        ddp(mine, false).pow(2).mean().backward();
        EXPECT_LT(max_grad_error(ddp.module()->parameters(), expected), 1e-6) << "rank " << world.rank();
      },
      options());
}

// A step where a parameter got no gradient (without find_unused_parameters) is
// refused on every rank; the step after it, with every parameter used, is exact.
TEST(FailedStepPoints, AStepRefusedForAMissingGradientLeavesTheNextStepExact) {
  torch::manual_seed(5);
  MidFail reference;
  auto x = torch::randn({8, 6});
  auto expected = mid_fail_grads(reference, x);
  run_thread_world(
      2,
      [&](cohort::comm::World& world) {
        auto model = std::dynamic_pointer_cast<MidFailImpl>(reference->clone());
        DistributedDataParallel ddp(MidFail(model), world.group(),
                                    DistributedDataParallelOptions().bucket_cap_bytes(1).first_bucket_cap_bytes(1));
        auto mine = x.chunk(2)[world.rank()];
        auto out = ddp(mine, false);
        // The loss skips the first layer's bias path... by using the second layer alone.
        auto partial = model->b(torch::ones({2, 8})).sum();
        try {
          partial.backward();
          ADD_FAILURE() << "expected the missing gradients to be named";
        } catch (const cohort::ConfigError& e) {
          EXPECT_NE(std::string(e.what()).find("a.weight"), std::string::npos) << e.what();
        }
        ddp.module()->zero_grad();
        ddp(mine, false).pow(2).mean().backward();
        EXPECT_LT(max_grad_error(ddp.module()->parameters(), expected), 1e-6) << "rank " << world.rank();
        (void)out;
      },
      options());
}

// Note [Steps that pair]: a rank whose training forward got no DDP backward (its
// loss ignored the output) goes on to the next step while its peers are still in
// this one. Their collectives have the same sizes, so nothing stops them from
// pairing; the step status tells, and every rank gets an error naming the ranks'
// steps instead of averaging one step's gradients with another's (or, where sizes
// differ, an abort inside Gloo).
TEST(FailedStepPoints, RanksInDifferentStepsAreToldSoInsteadOfAveragingAcrossSteps) {
  for (bool find_unused : {false, true}) {
    run_thread_world(
        2,
        [&](cohort::comm::World& world) {
          auto model = cohort::testing::small_mlp();
          DistributedDataParallel ddp(model, world.group(),
                                      DistributedDataParallelOptions().find_unused_parameters(find_unused));
          auto x = torch::ones({4, 6}) * (world.rank() + 1);
          ddp(x).sum().backward();
          if (world.rank() == 1) {  // a forward whose backward does not reach DDP
            auto ignored = ddp(x);
            (torch::zeros({}, torch::requires_grad()) * 1).backward();
          }
          try {
            ddp(x).sum().backward();
            ADD_FAILURE() << "find_unused " << find_unused << ": expected the ranks' steps to differ";
          } catch (const cohort::CommError& e) {
            std::string what = e.what();
            EXPECT_NE(what.find("rank 0 in step 2, rank 1 in step 3"), std::string::npos) << what;
            EXPECT_NE(what.find("NoGradGuard"), std::string::npos) << what;
          }
        },
        options());
  }
}

}  // namespace
