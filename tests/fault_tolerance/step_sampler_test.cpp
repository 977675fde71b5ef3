#include <gtest/gtest.h>

#include <set>

#include "cohort/errors.h"
#include "cohort/fault_tolerance/step_sampler.h"

namespace ft = cohort::fault_tolerance;

// Note [A global batch per step]: whatever the number of replicas at each step,
// each sample is seen exactly once per epoch, and the loss weights make DDP's
// average the global batch's mean.
TEST(StepSampler, EverySampleOncePerEpochWhileTheQuorumChanges) {
  ft::StepSampler sampler(ft::StepSamplerOptions(100, 10).seed(3));
  ASSERT_EQ(sampler.steps_per_epoch(), 10);
  const int sizes[] = {3, 3, 2, 2, 1, 4, 3, 3, 2, 3};
  std::multiset<std::int64_t> seen;
  for (std::int64_t step = 0; step < 10; ++step) {
    double weights = 0;
    for (int r = 0; r < sizes[step]; ++r) {
      for (auto i : sampler.indices(step, r, sizes[step])) seen.insert(i);
      weights += sampler.loss_weight(step, r, sizes[step]) / sizes[step];
    }
    EXPECT_NEAR(weights, 1.0, 1e-12);
  }
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_EQ(std::set<std::int64_t>(seen.begin(), seen.end()).size(), 100u);
}

TEST(StepSampler, ARedoneStepTakesTheSameSamples) {
  ft::StepSampler a(ft::StepSamplerOptions(64, 8).seed(1));
  std::vector<std::int64_t> three, two;
  for (int r = 0; r < 3; ++r) {
    auto part = a.indices(5, r, 3);
    three.insert(three.end(), part.begin(), part.end());
  }
  for (int r = 0; r < 2; ++r) {
    auto part = a.indices(5, r, 2);
    two.insert(two.end(), part.begin(), part.end());
  }
  EXPECT_EQ(three, two);
  EXPECT_NE(a.indices(5, 0, 1), a.indices(13, 0, 1));  // another epoch, another order
}

TEST(StepSampler, RefusesABatchThatDoesNotFit) {
  EXPECT_THROW(ft::StepSampler(ft::StepSamplerOptions(10, 11)), cohort::ConfigError);
  EXPECT_THROW(ft::StepSampler(ft::StepSamplerOptions(10, 0)), cohort::ConfigError);
}
