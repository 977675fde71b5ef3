// The GPT trainer's --preset (examples/gpt/preset.h) through its real flag parser:
// the values it sets, explicit flags over it (Note [A preset under explicit flags]),
// the vocabulary's padding (Note [The padding is never a token]), and GPT-2 small's
// parameter count with its tied embedding, built in one rank and stepped once at a
// short context (no training at that size on the CPU); and the MFU's flags beside it
// (--peak-tflops, --timing-warmup).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "cohort/errors.h"
#include "model.h"
#include "options.h"
#include "preset.h"
#include "support/thread_world.h"

namespace {

gpt::GptTrainerOptions parse(std::vector<std::string> args) {
  args.insert(args.begin(), "gpt");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  auto o = gpt::parse_options(static_cast<int>(argv.size()), argv.data());
  if (!o) throw std::runtime_error("--help");
  return *o;
}

TEST(GptPreset, WithoutOneTheDefaultsAreTheCpuModels) {
  const auto o = parse({});
  EXPECT_EQ(o.preset, "");
  EXPECT_EQ(o.layers, 4);
  EXPECT_EQ(o.embed_dim, 128);
  EXPECT_EQ(o.heads, 4);
  EXPECT_EQ(o.context, 64);
  EXPECT_EQ(o.vocab_multiple, 1);
  EXPECT_DOUBLE_EQ(o.lr, 3e-3);
}

TEST(GptPreset, Gpt2SmallSetsGpt2sShape) {
  const auto o = parse({"--preset", "gpt2-small"});
  EXPECT_EQ(o.layers, 12);
  EXPECT_EQ(o.embed_dim, 768);
  EXPECT_EQ(o.heads, 12);
  EXPECT_EQ(o.context, 1024);
  EXPECT_EQ(o.vocab_multiple, 128);
  EXPECT_DOUBLE_EQ(o.lr, 6e-4);
  // What it does not name keeps its default.
  EXPECT_EQ(o.tp, 2);
  EXPECT_EQ(o.batch_size, 32);
  EXPECT_EQ(o.vocab_size, 2048);
  EXPECT_DOUBLE_EQ(o.dropout, 0.0);
  const auto padded = gpt::padded_vocab_size(o.vocab_size, o.tp, o.vocab_multiple);
  EXPECT_EQ(padded % 128, 0);
  EXPECT_GE(padded, o.vocab_size);
}

TEST(GptPreset, ExplicitFlagsWinWhereverTheyStand) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--layers", "2", "--preset", "gpt2-small", "--context", "128", "--vocab-multiple", "64", "--lr", "1e-3"},
           {"--preset", "gpt2-small", "--layers", "2", "--context", "128", "--vocab-multiple", "64", "--lr", "1e-3"}}) {
    const auto o = parse(args);
    EXPECT_EQ(o.layers, 2);
    EXPECT_EQ(o.context, 128);
    EXPECT_EQ(o.vocab_multiple, 64);
    EXPECT_DOUBLE_EQ(o.lr, 1e-3);
    EXPECT_EQ(o.embed_dim, 768);  // the preset's, not given
    EXPECT_EQ(o.heads, 12);
  }
  // An explicit value equal to the default still counts as given.
  EXPECT_EQ(parse({"--preset", "gpt2-small", "--layers", "4"}).layers, 4);
}

// The sizes are checked together after the preset, as without one.
TEST(GptPreset, ItsSizesAreCheckedWithTheOtherFlags) {
  try {
    parse({"--preset", "gpt2-small", "--tp", "8"});
    ADD_FAILURE() << "12 heads over --tp 8 were accepted";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--heads 12 cannot be split over --tp 8"), std::string::npos) << e.what();
  }
  try {
    parse({"--preset", "gpt3"});
    ADD_FAILURE() << "an unknown preset was accepted";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("gpt2-small"), std::string::npos) << e.what();
  }
}

TEST(GptPreset, TheVocabularyIsPaddedToBothMultiples) {
  EXPECT_EQ(gpt::padded_vocab_size(2048, 2, 128), 2048);
  EXPECT_EQ(gpt::padded_vocab_size(2049, 1, 128), 2176);
  EXPECT_EQ(gpt::padded_vocab_size(50257, 1, 128), 50304);  // nanoGPT's
  EXPECT_EQ(gpt::padded_vocab_size(2049, 3, 128), 2304);  // lcm(3, 128) = 384
  EXPECT_EQ(gpt::padded_vocab_size(50257, 3, 128), 50304);  // 131 x 384 already
  EXPECT_EQ(gpt::padded_vocab_size(257, 2, 1), 258);  // without a preset: the TP size's, as before
  for (std::int64_t v = 256; v < 5000; v += 37)
    for (const std::int64_t tp : {1, 2, 4, 3}) {
      const auto padded = gpt::padded_vocab_size(v, tp, 128);
      EXPECT_EQ(padded % 128, 0) << v;
      EXPECT_EQ(padded % tp, 0) << v;
      EXPECT_GE(padded, v);
      EXPECT_LT(padded - v, 128 * tp) << v;
    }
  EXPECT_THROW(gpt::padded_vocab_size(100, 0, 128), cohort::ConfigError);
}

// GPT-2 small has 124,439,808 parameters at GPT-2's 50257 tokens with the output
// layer tied to the token embedding; padded to 50304, 47 more rows of 768.
TEST(GptPreset, Gpt2SmallHasGpt2sParameterCountAndStepsOnce) {
  const auto o = parse({"--preset", "gpt2-small", "--tp", "1"});
  const auto vocab = gpt::padded_vocab_size(50257, o.tp, o.vocab_multiple);
  cohort::testing::run_thread_world(1, [&](cohort::comm::World& w) {
    torch::manual_seed(0);
    gpt::Gpt model(w.group(), gpt::GptOptions(vocab)
                                  .unpadded_vocab_size(50257)
                                  .context(o.context)
                                  .embed_dim(o.embed_dim)
                                  .num_heads(o.heads)
                                  .layers(o.layers)
                                  .dropout(o.dropout));
    std::int64_t count = 0;
    for (const auto& p : model->parameters()) count += p.numel();
    EXPECT_EQ(count, 124439808 + 47 * 768);
    EXPECT_EQ(model->whole_parameter_count(), count);
    // One step at 16 of its 1024 positions: the padding's logits are there and zero
    // (never a target: Note [The padding is never a token]).
    auto ids = torch::randint(0, 50257, {1, 16}, torch::kLong);
    auto logits = model(ids);
    ASSERT_EQ(logits.size(-1), 50304);
    EXPECT_TRUE(torch::equal(logits.slice(-1, 50257), torch::zeros({1, 16, 47})));
    auto loss = model->loss(logits, torch::roll(ids, -1, 1));
    EXPECT_NEAR(loss.item<double>(), std::log(50304.0), 1.0);
    loss.backward();
    EXPECT_GT(model->embed->weight.grad().slice(0, 0, 50257).abs().sum().item<double>(), 0.0);
  });
}

// The MFU's flags (examples/gpt/performance.h): the peak to divide by, and the steps
// left out of the timing, refused when they leave none.
TEST(GptFlags, PeakTflopsAndTimingWarmupRefuseWhatCannotBeMeasured) {
  EXPECT_DOUBLE_EQ(parse({}).peak_tflops, 0.0);
  EXPECT_EQ(parse({}).timing_warmup, 0);
  const auto o = parse({"--peak-tflops", "500", "--timing-warmup", "3", "--steps", "10"});
  EXPECT_DOUBLE_EQ(o.peak_tflops, 500.0);
  EXPECT_EQ(o.timing_warmup, 3);
  EXPECT_THROW(parse({"--peak-tflops", "-1"}), cohort::ConfigError);
  try {
    parse({"--timing-warmup", "10", "--steps", "10"});
    FAIL() << "a warm-up of every step was accepted";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--timing-warmup 10"), std::string::npos) << e.what();
  }
}

}  // namespace
