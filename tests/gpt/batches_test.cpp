// Note [The batch rule] (examples/gpt/batches.h): the windows a Python peer replays.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <numeric>

#include "batches.h"
#include "cohort/errors.h"

namespace {

std::vector<std::int32_t> stream(int n) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), 0);
  return t;
}

TEST(GptBatches, OffsetsFollowTheRule) {
  // ((s B + j) 1000003) mod (N - C - 1), worked by hand: N 1000, C 8, B 4.
  EXPECT_EQ(gpt::window_offset(0, 0, 4, 1000, 8), 0);
  EXPECT_EQ(gpt::window_offset(0, 1, 4, 1000, 8), 1000003 % 991);
  EXPECT_EQ(gpt::window_offset(3, 2, 4, 1000, 8), (14LL * 1000003) % 991);
  // Large steps do not overflow.
  EXPECT_EQ(gpt::window_offset(1LL << 40, 0, 1 << 10, 1 << 30, 64),
            static_cast<std::int64_t>((static_cast<unsigned __int128>(1LL << 50) * 1000003) % ((1 << 30) - 65)));
}

TEST(GptBatches, TargetsAreTheNextTokens) {
  const auto t = stream(1000);
  const auto b = gpt::training_batch(t, 3, 4, 8, 0, 1);
  ASSERT_EQ(b.inputs.sizes(), (std::vector<std::int64_t>{4, 8}));
  for (int j = 0; j < 4; ++j) {
    const auto offset = gpt::window_offset(3, j, 4, 1000, 8);
    EXPECT_EQ(b.inputs[j][0].item<std::int64_t>(), offset);
    EXPECT_EQ(b.targets[j][7].item<std::int64_t>(), offset + 8);
  }
}

TEST(GptBatches, ReplicasSplitTheGlobalBatch) {
  const auto t = stream(5000);
  const auto whole = gpt::training_batch(t, 7, 6, 16, 0, 1);
  const auto first = gpt::training_batch(t, 7, 6, 16, 0, 2), second = gpt::training_batch(t, 7, 6, 16, 1, 2);
  EXPECT_TRUE(torch::cat({first.inputs, second.inputs}).equal(whole.inputs));
  EXPECT_TRUE(torch::cat({first.targets, second.targets}).equal(whole.targets));
}

TEST(GptBatches, ValidationWindowsDoNotOverlap) {
  const auto v = stream(100);
  const auto b0 = gpt::validation_batch(v, 0, 3, 10, 0, 1), b1 = gpt::validation_batch(v, 1, 3, 10, 0, 1);
  EXPECT_EQ(b0.inputs[1][0].item<std::int64_t>(), 10);
  EXPECT_EQ(b1.inputs[0][0].item<std::int64_t>(), 30);
  EXPECT_EQ(b1.targets[2][9].item<std::int64_t>(), 60);
  EXPECT_THROW(gpt::validation_batch(v, 3, 3, 10, 0, 1), cohort::ConfigError);  // 12 windows needed, 9 held
}

TEST(GptBatches, ShortStreamIsRefused) {
  EXPECT_THROW(gpt::training_batch(stream(9), 0, 1, 8, 0, 1), cohort::ConfigError);
}

}  // namespace
