// GradScaler in one process: PyTorch's semantics (scale, unscale_, step, update, the
// state dict) and exact unscaling (amp/grad_scaler.h). The agreement across ranks is
// tested through `cohort run` in multiproc/amp_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "cohort/amp/grad_scaler.h"
#include "cohort/checkpoint/trainer_state.h"
#include "cohort/errors.h"

namespace {

using cohort::amp::GradScaler;
using cohort::amp::GradScalerOptions;

struct Toy {
  torch::nn::Sequential model{nullptr};
  torch::Tensor x, y;
  Toy() {
    torch::manual_seed(3);
    model = torch::nn::Sequential(torch::nn::Linear(6, 5), torch::nn::Tanh(), torch::nn::Linear(5, 2));
    x = torch::randn({7, 6});
    y = torch::randint(0, 2, {7});
  }
  torch::Tensor loss() { return torch::nn::functional::cross_entropy(model->forward(x), y); }
  std::vector<torch::Tensor> snapshot(bool grads) {
    std::vector<torch::Tensor> out;
    for (auto& p : model->parameters()) out.push_back((grads ? p.grad() : p).clone());
    return out;
  }
};

bool all_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

TEST(GradScaler, PyTorchDefaults) {
  GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.options().growth_factor(), 2.0);
  EXPECT_EQ(scaler.options().backoff_factor(), 0.5);
  EXPECT_EQ(scaler.options().growth_interval(), 2000);
  auto loss = torch::tensor(1.5);
  EXPECT_EQ(scaler.scale(loss).item<double>(), 1.5 * 65536);
}

TEST(GradScaler, UnscaledGradientsAreBitwiseThoseOfAnUnscaledBackward) {
  Toy s;
  s.loss().backward();
  const auto reference = s.snapshot(true);
  torch::optim::SGD opt(s.model->parameters(), 0.1);
  opt.zero_grad();
  GradScaler scaler;
  scaler.scale(s.loss()).backward();
  EXPECT_FALSE(all_equal(s.snapshot(true), reference));  // scaled
  scaler.unscale_(opt);
  EXPECT_TRUE(all_equal(s.snapshot(true), reference));
}

TEST(GradScaler, AnInfSkipsTheStepAndHalvesTheScale) {
  Toy s;
  torch::optim::SGD opt(s.model->parameters(), 0.1);
  GradScaler scaler;
  scaler.scale(s.loss()).backward();
  s.model->parameters()[0].mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
  const auto before = s.snapshot(false);
  EXPECT_FALSE(scaler.step(opt));
  EXPECT_TRUE(all_equal(s.snapshot(false), before));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  // A NaN counts the same.
  opt.zero_grad();
  scaler.scale(s.loss()).backward();
  s.model->parameters()[1].mutable_grad()[0] = std::nan("");
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 16384.0);
}

TEST(GradScaler, GrowsAfterGrowthIntervalCleanSteps) {
  Toy s;
  torch::optim::SGD opt(s.model->parameters(), 0.01);
  GradScaler scaler(GradScalerOptions().init_scale(8).growth_interval(3));
  for (int step = 1; step <= 7; ++step) {
    opt.zero_grad();
    scaler.scale(s.loss()).backward();
    const auto before = s.snapshot(false);
    EXPECT_TRUE(scaler.step(opt));
    EXPECT_FALSE(all_equal(s.snapshot(false), before));
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), step < 3 ? 8.0 : step < 6 ? 16.0 : 32.0) << "step " << step;
    EXPECT_EQ(scaler.growth_tracker(), step % 3);
  }
}

TEST(GradScaler, GrowthThatWouldOverflowFloatKeepsTheScale) {
  Toy s;
  torch::optim::SGD opt(s.model->parameters(), 0.0);
  const double top = std::ldexp(1.0, 127);
  GradScaler scaler(GradScalerOptions().init_scale(top).growth_interval(1));
  scaler.scale(s.loss() * 0).backward();
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), top);
}

// Note [A float32 scale]: for a scale that is not a power of two, the sequence is
// PyTorch's float32 one, bitwise. The expected values are PyTorch 1.13's
// (_amp_update_scale_'s arithmetic: shared/repro/amp-dp-ddp, `ref_amp.py sequence
// 1000.1 3 0.3 3 0001000011000000001`). A double scale drifted by an ulp from the
// first step on (1000.1 instead of 1000.0999755859375).
TEST(GradScaler, TheScaleSequenceIsPyTorchsFloat32One) {
  Toy s;
  torch::optim::SGD opt(s.model->parameters(), 0.0);
  GradScaler scaler(GradScalerOptions().init_scale(1000.1).growth_factor(3).backoff_factor(0.3).growth_interval(3));
  EXPECT_EQ(scaler.get_scale(), 1000.0999755859375);
  EXPECT_EQ(scaler.state_dict().at("scale").toDouble(), 1000.0999755859375);
  const std::string pattern = "0001000011000000001";
  const std::vector<double> pytorch = {
      1000.0999755859375, 1000.0999755859375, 3000.2998046875,    900.0899658203125, 900.0899658203125,
      900.0899658203125,  2700.27001953125,   2700.27001953125,   810.08099365234375, 243.0242919921875,
      243.0242919921875,  243.0242919921875,  729.0728759765625,  729.0728759765625, 729.0728759765625,
      2187.21875,         2187.21875,         2187.21875,         656.1656494140625};
  ASSERT_EQ(pattern.size(), pytorch.size());
  for (std::size_t step = 0; step < pattern.size(); ++step) {
    opt.zero_grad();
    scaler.scale(s.loss()).backward();
    if (pattern[step] == '1') s.model->parameters()[0].mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
    EXPECT_EQ(scaler.step(opt), pattern[step] == '0') << "step " << step;
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), pytorch[step]) << "step " << step;
  }
  // The unscaled gradients are those of PyTorch's float32 1 / scale.
  opt.zero_grad();
  scaler.scale(s.loss()).backward();
  const auto scaled = s.snapshot(true);
  scaler.unscale_(opt);
  const float inv = static_cast<float>(1.0 / 656.1656494140625);
  const auto got = s.snapshot(true);
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(got[i], scaled[i] * inv)) << i;
  // An init_scale that float32 cannot hold is refused.
  EXPECT_THROW(GradScaler(GradScalerOptions().init_scale(1e39)), cohort::ConfigError);
}

TEST(GradScaler, MisuseIsNamed) {
  Toy s;
  torch::optim::SGD opt(s.model->parameters(), 0.1);
  GradScaler scaler;
  EXPECT_THROW(scaler.update(), cohort::ConfigError);  // nothing recorded yet
  scaler.scale(s.loss()).backward();
  scaler.unscale_(opt);
  try {
    scaler.unscale_(opt);
    FAIL() << "a second unscale_ was accepted";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("already called"), std::string::npos) << e.what();
  }
  scaler.step(opt);
  EXPECT_THROW(scaler.step(opt), cohort::ConfigError);
  EXPECT_THROW(scaler.unscale_(opt), cohort::ConfigError);
  scaler.update();
  EXPECT_THROW(GradScaler(GradScalerOptions().growth_factor(1.0)), cohort::ConfigError);
  EXPECT_THROW(GradScaler(GradScalerOptions().backoff_factor(1.5)), cohort::ConfigError);
  EXPECT_THROW(GradScaler(GradScalerOptions().growth_interval(0)), cohort::ConfigError);
}

TEST(GradScaler, RefusesFloat16Gradients) {
  auto p = torch::zeros({3}, torch::kHalf).requires_grad_();
  p.mutable_grad() = torch::ones({3}, torch::kHalf);
  torch::optim::SGD opt({p}, 0.1);
  GradScaler scaler;
  EXPECT_THROW(scaler.unscale_(opt), cohort::ConfigError);
}

TEST(GradScaler, ARefusedUnscaleChangesNoGradient) {
  auto a = torch::zeros({2}).requires_grad_();
  auto b = torch::zeros({2}, torch::kHalf).requires_grad_();
  a.mutable_grad() = torch::full({2}, 8.0);
  b.mutable_grad() = torch::full({2}, 8.0, torch::kHalf);
  torch::optim::SGD opt({a, b}, 0.1);
  GradScaler scaler(GradScalerOptions().init_scale(4));
  EXPECT_THROW(scaler.unscale_(opt), cohort::ConfigError);
  EXPECT_TRUE(torch::equal(a.grad(), torch::full({2}, 8.0)));
}

TEST(GradScaler, AStepWithNoGradientIsAnError) {
  auto a = torch::zeros({2}).requires_grad_();
  torch::optim::SGD opt({a}, 0.1);
  GradScaler scaler;
  EXPECT_THROW(scaler.step(opt), cohort::ConfigError);
}

TEST(GradScaler, ALoadedStateIsCheckedAsTheConstructorChecks) {
  auto state_with = [](const char* key, c10::IValue value) {
    GradScaler scaler;
    auto state = scaler.state_dict();
    state.insert_or_assign(key, value);
    return state;
  };
  GradScaler scaler;
  EXPECT_THROW(scaler.load_state_dict(state_with("growth_interval", int64_t{-5})), cohort::DataError);
  EXPECT_THROW(scaler.load_state_dict(state_with("growth_interval", 0.5)), cohort::DataError);
  EXPECT_THROW(scaler.load_state_dict(state_with("growth_factor", 0.25)), cohort::DataError);
  EXPECT_THROW(scaler.load_state_dict(state_with("backoff_factor", 3.0)), cohort::DataError);
  EXPECT_THROW(scaler.load_state_dict(state_with("_growth_tracker", int64_t{-100000})), cohort::DataError);
  EXPECT_EQ(scaler.get_scale(), 65536.0);  // nothing of a refused state was taken
}

TEST(GradScaler, EachOptimizerChecksItsOwnGradients) {
  Toy s;
  auto params = s.model->parameters();
  torch::optim::SGD first({params[0], params[1]}, 0.1);
  torch::optim::Adam second({params[2], params[3]}, 0.1);
  GradScaler scaler;
  scaler.scale(s.loss()).backward();
  params[3].mutable_grad()[0] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(scaler.step(first));    // its own gradients are finite
  EXPECT_FALSE(scaler.step(second));
  scaler.update();                    // one overflow in the iteration backs off
  EXPECT_EQ(scaler.get_scale(), 32768.0);
}

TEST(GradScaler, DisabledPassesThrough) {
  Toy s;
  torch::optim::SGD opt(s.model->parameters(), 0.1);
  GradScaler scaler(GradScalerOptions().enabled(false));
  auto loss = s.loss();
  EXPECT_TRUE(torch::equal(scaler.scale(loss), loss));
  loss.backward();
  const auto before = s.snapshot(false);
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_FALSE(all_equal(s.snapshot(false), before));
  scaler.update();
  EXPECT_TRUE(scaler.state_dict().empty());
}

// The state resumes exactly through a checkpoint's trainer state, under PyTorch's keys.
TEST(GradScaler, StateResumesThroughACheckpoint) {
  Toy s;
  torch::optim::SGD opt(s.model->parameters(), 0.1);
  GradScaler scaler(GradScalerOptions().growth_interval(5));
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    scaler.scale(s.loss()).backward();
    if (step == 0) s.model->parameters()[0].mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
    scaler.step(opt);
    scaler.update();
  }
  ASSERT_EQ(scaler.get_scale(), 32768.0);
  ASSERT_EQ(scaler.growth_tracker(), 2);
  cohort::checkpoint::TrainingProgress progress;
  progress.extra["grad_scaler"] = scaler.state_dict();
  const auto bytes = cohort::checkpoint::encode_trainer_state(progress, {});
  const auto back = cohort::checkpoint::decode_trainer_state(bytes, "trainer.pt");
  GradScaler resumed;
  resumed.load_state_dict(back.progress.extra.at("grad_scaler").toGenericDict());
  EXPECT_EQ(resumed.get_scale(), 32768.0);
  EXPECT_EQ(resumed.growth_tracker(), 2);
  EXPECT_EQ(resumed.options().growth_interval(), 5);
  const auto state = scaler.state_dict();
  for (const char* key : {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"})
    EXPECT_TRUE(state.contains(key)) << key;
  c10::impl::GenericDict wrong(c10::StringType::get(), c10::AnyType::get());
  wrong.insert("scale", 2.0);
  EXPECT_THROW(resumed.load_state_dict(wrong), cohort::DataError);
}

}  // namespace
