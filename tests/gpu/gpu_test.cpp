// Tests that need a GPU: labelled `gpu`. scripts/run-tests runs them when a GPU is
// visible and otherwise lists each one as NOT RUN (docs/gpu_without_a_gpu.md), so
// a machine without a GPU never reports them as passed. Each test also fails, rather
// than skips, when started without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/amp/autocast.h"
#include "cohort/amp/grad_scaler.h"
#include "cohort/dp/data_parallel.h"
#include "cohort/recompute/checkpoint.h"

namespace {

int gpus() { return static_cast<int>(torch::cuda::device_count()); }

torch::nn::Sequential make_model() {
  torch::manual_seed(13);
  return torch::nn::Sequential(torch::nn::Linear(6, 12), torch::nn::Tanh(), torch::nn::Dropout(0.2),
                               torch::nn::Linear(12, 3));
}

TEST(Gpu, DataParallelOverEveryGpuEqualsOneModule) {
  ASSERT_GT(gpus(), 0) << "a gpu test started without a GPU";
  std::vector<c10::Device> devices;
  for (int i = 0; i < gpus(); ++i) devices.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
  auto model = make_model(), reference = make_model();
  model->eval();
  reference->eval();
  model->to(torch::kCUDA, torch::kDouble);
  reference->to(torch::kCUDA, torch::kDouble);
  cohort::dp::DataParallel<torch::nn::Sequential> dp(model, cohort::dp::DataParallelOptions(devices));
  auto x = torch::randn({4 * gpus() + 1, 6}, torch::TensorOptions().dtype(torch::kDouble).device(torch::kCUDA));
  dp(x).pow(2).sum().backward();
  reference->forward(x).pow(2).sum().backward();
  for (std::size_t i = 0; i < model->parameters().size(); ++i)
    EXPECT_LT((model->parameters()[i].grad() - reference->parameters()[i].grad()).abs().max().item<double>(), 1e-12);
}

// Under fp16 autocast the backward runs in half precision, whose largest value is
// 65504: at the default scale of 2^16 a loss gradient above 1 overflows.
// The scaler must then skip the step (weights untouched) and halve the scale; at a
// scale the gradients fit in, unscaling is exact (dividing by a power of two) and
// the step is taken. The first run on an H100 (docs/gpu_results.md) overflowed at
// 2^16, as the trainer's first fp16 step does.
TEST(Gpu, Fp16AutocastWithTheScalerSkipsAnOverflowAndUnscalesExactly) {
  ASSERT_GT(gpus(), 0) << "a gpu test started without a GPU";
  auto model = make_model();
  model->eval();
  model->to(torch::kCUDA);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  auto x = torch::randn({8, 6}).to(torch::kCUDA);
  auto scaled_backward = [&](cohort::amp::GradScaler& scaler, double loss_factor) {
    opt.zero_grad();
    cohort::amp::Autocast autocast{cohort::amp::AutocastOptions(c10::DeviceType::CUDA)};
    auto out = model->forward(x);
    EXPECT_EQ(out.scalar_type(), torch::kHalf) << "the linear layers did not run in fp16 under autocast";
    scaler.scale(loss_factor * out.to(torch::kFloat).pow(2).sum()).backward();
  };
  std::vector<torch::Tensor> before;
  for (auto& p : model->parameters()) before.push_back(p.detach().clone());

  // The loss times 10^4: its gradient, 2 * 10^4 * out * 2^16, overflows fp16 on its
  // way into the half-precision backward.
  cohort::amp::GradScaler overflowing;
  scaled_backward(overflowing, 1e4);
  EXPECT_FALSE(overflowing.step(opt)) << "the step was taken with non-finite gradients";
  overflowing.update();
  EXPECT_EQ(overflowing.get_scale(), 32768.0);
  for (std::size_t i = 0; i < before.size(); ++i)
    EXPECT_TRUE(torch::equal(model->parameters()[i], before[i])) << "a skipped step changed parameter " << i;

  cohort::amp::GradScaler scaler(cohort::amp::GradScalerOptions().init_scale(16.0));
  scaled_backward(scaler, 1.0);
  std::vector<torch::Tensor> scaled;
  for (auto& p : model->parameters()) {
    ASSERT_TRUE(p.grad().isfinite().all().item<bool>()) << "a gradient overflowed at scale 16";
    scaled.push_back(p.grad().clone());
  }
  scaler.unscale_(opt);
  for (std::size_t i = 0; i < scaled.size(); ++i)
    EXPECT_TRUE(torch::equal(model->parameters()[i].grad(), scaled[i] / 16.0)) << "parameter " << i;
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 16.0);
  bool moved = false;
  for (std::size_t i = 0; i < before.size(); ++i) moved = moved || !torch::equal(model->parameters()[i], before[i]);
  EXPECT_TRUE(moved) << "the step was reported taken but no parameter changed";
}

TEST(Gpu, RecomputationRestoresTheCudaGenerator) {
  ASSERT_GT(gpus(), 0) << "a gpu test started without a GPU";
  auto plain = make_model(), ckpt = make_model();
  plain->to(torch::kCUDA);
  ckpt->to(torch::kCUDA);
  auto x = torch::randn({8, 6}, torch::kCUDA);
  torch::cuda::manual_seed_all(5);
  plain->forward(x).pow(2).sum().backward();
  torch::cuda::manual_seed_all(5);
  cohort::recompute::checkpoint_sequential(ckpt, 2, x).pow(2).sum().backward();
  for (std::size_t i = 0; i < plain->parameters().size(); ++i)
    EXPECT_TRUE(torch::equal(plain->parameters()[i].grad(), ckpt->parameters()[i].grad())) << "parameter " << i;
}

}  // namespace
