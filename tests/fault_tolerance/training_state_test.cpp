#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

#include "cohort/errors.h"
#include "cohort/fault_tolerance/training_state.h"

namespace ft = cohort::fault_tolerance;

TEST(TrainingState, AJoinerGetsWeightsMomentsAndRandomState) {
  torch::manual_seed(0);
  torch::nn::Linear src(4, 3);
  torch::optim::Adam src_opt(src->parameters(), 0.01);
  for (int i = 0; i < 3; ++i) {
    src_opt.zero_grad();
    src(torch::randn({5, 4})).pow(2).sum().backward();
    src_opt.step();
  }
  std::stringstream wire;
  ft::save_training_state(wire, *src, &src_opt);
  const auto next_random = torch::rand({3});

  torch::manual_seed(99);
  torch::nn::Linear dst(4, 3);
  torch::optim::Adam dst_opt(dst->parameters(), 0.01);
  ft::load_training_state(wire, *dst, &dst_opt);
  EXPECT_TRUE(torch::equal(torch::rand({3}), next_random));
  // One more identical step on both: equal only if Adam's moments and counts came too.
  auto x = torch::randn({5, 4});
  src_opt.zero_grad();
  src(x).pow(2).sum().backward();
  src_opt.step();
  dst_opt.zero_grad();
  dst(x).pow(2).sum().backward();
  dst_opt.step();
  EXPECT_TRUE(torch::equal(src->weight, dst->weight));
}

TEST(TrainingState, AStreamForAnotherModelIsADataError) {
  torch::nn::Linear small(2, 2);
  std::stringstream wire;
  ft::save_training_state(wire, *small, nullptr);
  torch::nn::Linear big(8, 8);
  try {
    ft::load_training_state(wire, *big, nullptr);
    FAIL() << "loaded a 2x2 state into an 8x8 model";
  } catch (const cohort::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("same model"), std::string::npos) << e.what();
  }
}
