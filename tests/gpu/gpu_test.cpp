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

TEST(Gpu, Fp16AutocastWithTheScalerUnscalesExactly) {
  ASSERT_GT(gpus(), 0) << "a gpu test started without a GPU";
  auto model = make_model();
  model->eval();
  model->to(torch::kCUDA);
  auto x = torch::randn({8, 6}, torch::kCUDA);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  cohort::amp::GradScaler scaler;
  {
    cohort::amp::Autocast autocast{cohort::amp::AutocastOptions(c10::DeviceType::CUDA)};
    scaler.scale(model->forward(x).to(torch::kFloat).pow(2).sum()).backward();
  }
  std::vector<torch::Tensor> scaled;
  for (auto& p : model->parameters()) scaled.push_back(p.grad().clone());
  scaler.unscale_(opt);
  // Dividing by a power of two is exact in float32.
  for (std::size_t i = 0; i < scaled.size(); ++i)
    EXPECT_TRUE(torch::equal(model->parameters()[i].grad(), scaled[i] / scaler.get_scale()));
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
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
