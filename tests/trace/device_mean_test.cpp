#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/errors.h"
#include "cohort/trace/device_mean.h"

namespace {

TEST(DeviceMean, TakesTheMeanSinceTheLastTakeAndStartsOver) {
  cohort::trace::DeviceMean m;
  EXPECT_FALSE(m.take().has_value());
  m.add(torch::tensor(1.0f));
  m.add(torch::tensor({2.0}));  // one element of another shape and dtype
  m.add(torch::tensor(6.0f).reshape({1, 1}));
  EXPECT_EQ(m.count(), 3);
  EXPECT_DOUBLE_EQ(m.take().value(), 3.0);
  EXPECT_FALSE(m.take().has_value());
  m.add(torch::tensor(-4.0));
  EXPECT_DOUBLE_EQ(m.take().value(), -4.0);
}

TEST(DeviceMean, AddingDoesNotHoldTheGraph) {
  cohort::trace::DeviceMean m;
  auto w = torch::ones({3}, torch::requires_grad());
  m.add((w * 2).sum());
  EXPECT_DOUBLE_EQ(m.take().value(), 6.0);
}

TEST(DeviceMean, MoreThanOneValueIsRefused) {
  cohort::trace::DeviceMean m;
  try {
    m.add(torch::ones({2}));
    FAIL();
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("[2]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(m.count(), 0);
}

}  // namespace
