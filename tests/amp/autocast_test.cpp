// The autocast guard: what runs in lower precision inside it, what its exit restores,
// and what it refuses (amp/autocast.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/amp/autocast.h"
#include "cohort/compat/autocast.h"
#include "cohort/errors.h"

namespace {

using cohort::amp::Autocast;
using cohort::amp::AutocastOptions;

TEST(Autocast, MatmulRunsInBFloat16InsideTheGuardAndFloatAfter) {
  auto a = torch::randn({4, 8}), b = torch::randn({8, 3});
  {
    Autocast autocast{AutocastOptions(torch::kCPU)};
    EXPECT_TRUE(cohort::compat::autocast_enabled(torch::kCPU));
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    // Autocast leaves ops outside its lists alone.
    EXPECT_EQ((a + 1).scalar_type(), torch::kFloat);
  }
  EXPECT_FALSE(cohort::compat::autocast_enabled(torch::kCPU));
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat);
}

TEST(Autocast, NestedGuardsRestoreWhatTheyFound) {
  auto a = torch::randn({2, 2});
  Autocast outer{AutocastOptions(torch::kCPU)};
  {
    Autocast inner(AutocastOptions(torch::kCPU).enabled(false).cache_enabled(false));
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);
    EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());
  }
  EXPECT_TRUE(at::autocast::is_autocast_cache_enabled());
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
}

// Note [Nested cast cache]: as torch.autocast, an inner guard inherits an outer
// guard's disabled cache, so a weight the optimizer changed is cast afresh each step
// (before, the inner guard's cache kept step 0's casts: y was off by 8.8 at step 1).
TEST(Autocast, AnInnerGuardKeepsTheCacheAnOuterOneDisabled) {
  torch::manual_seed(0);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(2, 3, 3));
  auto x = torch::randn({1, 2, 5, 5});
  EXPECT_TRUE(at::autocast::is_autocast_cache_enabled());
  {
    Autocast outer{AutocastOptions(torch::kCPU).cache_enabled(false)};
    for (int step = 0; step < 2; ++step) {
      torch::Tensor y;
      {
        Autocast inner{AutocastOptions(torch::kCPU)};
        EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());
        {
          Autocast innermost(AutocastOptions(torch::kCPU).cache_enabled(true));
          EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());
        }
        y = conv(x);
      }
      EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());
      // The same convolution on this step's weights, cast by hand outside autocast.
      torch::Tensor expected;
      {
        Autocast off(AutocastOptions(torch::kCPU).enabled(false));
        expected = torch::conv2d(x.to(torch::kBFloat16), conv->weight.detach().to(torch::kBFloat16),
                                 conv->bias.detach().to(torch::kBFloat16));
      }
      EXPECT_TRUE(torch::equal(y, expected)) << "step " << step << ": max|y - expected| "
                                             << (y.to(torch::kFloat) - expected.to(torch::kFloat)).abs().max();
      torch::NoGradGuard no_grad;
      for (auto& p : conv->parameters()) p.add_(1.0);  // the optimizer's in-place update
    }
  }
  EXPECT_TRUE(at::autocast::is_autocast_cache_enabled());
}

TEST(Autocast, GradientsOfFloatParametersStayFloat) {
  torch::manual_seed(0);
  torch::nn::Linear layer(8, 3);
  auto x = torch::randn({5, 8});
  torch::Tensor loss;
  {
    Autocast autocast{AutocastOptions(torch::kCPU)};
    loss = layer(x).sum();
  }
  EXPECT_EQ(loss.scalar_type(), torch::kBFloat16);
  loss.backward();
  EXPECT_EQ(layer->weight.grad().scalar_type(), torch::kFloat);
  EXPECT_TRUE(layer->weight.grad().isfinite().all().item<bool>());
}

TEST(Autocast, RefusesFloat16OnTheCpuAndChangesNothing) {
  try {
    Autocast autocast(AutocastOptions(torch::kCPU).dtype(torch::kHalf));
    FAIL() << "float16 on the CPU was accepted";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16 only"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(cohort::compat::autocast_enabled(torch::kCPU));
  EXPECT_THROW(Autocast(AutocastOptions(c10::DeviceType::XLA)), cohort::ConfigError);
}

TEST(Autocast, ParsesTheTrainerFlagValues) {
  EXPECT_EQ(cohort::amp::parse_amp_dtype("bf16"), torch::kBFloat16);
  EXPECT_EQ(cohort::amp::parse_amp_dtype("fp16"), torch::kHalf);
  EXPECT_FALSE(cohort::amp::parse_amp_dtype("off").has_value());
  EXPECT_THROW(cohort::amp::parse_amp_dtype("fp8"), cohort::ConfigError);
}

}  // namespace
