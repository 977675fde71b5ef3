// Which kernel a step runs, and the refusals when the one asked for is missing.
#include <gtest/gtest.h>

#include "cohort/compat/fused_optimizer.h"
#include "cohort/errors.h"
#include "cohort/optim/kernel.h"

namespace {

using cohort::optim::StepKernel;

TEST(StepKernel, NamesRoundTripAndABadOneListsTheGoodOnes) {
  for (auto k : {StepKernel::automatic, StepKernel::for_loop, StepKernel::foreach, StepKernel::fused})
    EXPECT_EQ(cohort::optim::parse_step_kernel(cohort::optim::to_string(k)), k);
  try {
    cohort::optim::parse_step_kernel("fast");
    FAIL();
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("auto, for-loop, foreach or fused"), std::string::npos) << e.what();
  }
}

TEST(StepKernel, AutomaticIsFusedWhereThereIsOneAndTheForLoopOnTheCpuOtherwise) {
  const c10::Device cpu(c10::kCPU);
  const auto want = cohort::compat::kHasFusedOptimizers ? StepKernel::fused : StepKernel::for_loop;
  EXPECT_EQ(cohort::optim::resolve(StepKernel::automatic, cpu, c10::kFloat), want);
  // No fused kernel for integers anywhere: an accelerator falls back to foreach.
  EXPECT_EQ(cohort::optim::resolve(StepKernel::automatic, cpu, c10::kLong), StepKernel::for_loop);
  EXPECT_EQ(cohort::optim::resolve(StepKernel::automatic, c10::Device(c10::kCUDA, 0), c10::kLong), StepKernel::foreach);
  EXPECT_EQ(cohort::optim::resolve(StepKernel::foreach, cpu, c10::kFloat), StepKernel::foreach);
}

TEST(StepKernel, FusedWhereThereIsNoneIsRefusedWithTheFix) {
  if (cohort::compat::kHasFusedOptimizers) {
    EXPECT_EQ(cohort::optim::resolve(StepKernel::fused, c10::Device(c10::kCPU), c10::kFloat), StepKernel::fused);
  }
  const auto dtype = cohort::compat::kHasFusedOptimizers ? c10::kLong : c10::kFloat;
  try {
    cohort::optim::resolve(StepKernel::fused, c10::Device(c10::kCPU), dtype);
    FAIL() << "fused was granted where there is none";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("StepKernel::foreach"), std::string::npos) << e.what();
  }
}

}  // namespace
