// Model parallelism in one process over several "cpu" devices (the same code moves
// between GPUs on a GPU machine), against the plain model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/errors.h"
#include "cohort/pipeline/local_pipeline.h"
#include "cohort/pipeline/split.h"

namespace {

using namespace cohort::pipeline;

torch::nn::Sequential mlp(std::uint64_t seed = 1) {
  torch::manual_seed(seed);
  torch::nn::Sequential m;
  m->push_back("fc1", torch::nn::Linear(5, 16));
  m->push_back("act1", torch::nn::Tanh());
  m->push_back("fc2", torch::nn::Linear(16, 16));
  m->push_back("act2", torch::nn::Tanh());
  m->push_back("fc3", torch::nn::Linear(16, 3));
  m->to(torch::kDouble);
  return m;
}

double max_grad_diff(const torch::nn::Module& a, const torch::nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  double worst = 0;
  for (const auto& item : pa) worst = std::max(worst, (item.value().grad() - pb[item.key()].grad()).abs().max().item<double>());
  return worst;
}

class LocalPipelineParity : public ::testing::TestWithParam<int> {};

TEST_P(LocalPipelineParity, EqualsThePlainModelForwardAndBackward) {
  const int microbatches = GetParam();
  auto reference = mlp();
  auto model = mlp();
  std::vector<c10::Device> cpus(3, c10::Device("cpu"));
  LocalPipeline pipe(split_by_balance(model, {2, 2, 1}), cpus, LocalPipelineOptions().microbatches(microbatches));
  auto x = torch::randn({7, 5}, torch::kDouble);
  auto y = torch::randint(0, 3, {7});
  auto out = pipe.forward(x);
  auto expected = reference->forward(x);
  EXPECT_TRUE(torch::allclose(out, expected, 1e-12, 1e-12));
  torch::nn::functional::cross_entropy(out, y).backward();
  torch::nn::functional::cross_entropy(expected, y).backward();
  EXPECT_LT(max_grad_diff(*model, *reference), 1e-12);
  EXPECT_EQ(pipe.parameters().size(), reference->parameters().size());
}

INSTANTIATE_TEST_SUITE_P(MicroBatches, LocalPipelineParity, ::testing::Values(1, 3, 7));

TEST(LocalPipeline, CarriesGradModeToTheDeviceThreads) {
  auto model = mlp();
  LocalPipeline pipe(split_by_balance(model, {3, 2}), {c10::Device("cpu"), c10::Device("cpu")},
                     LocalPipelineOptions().microbatches(2));
  auto x = torch::randn({4, 5}, torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(pipe.forward(x).requires_grad());
  }
  EXPECT_TRUE(pipe.forward(x).requires_grad());
}

// Issue 29 (pipeline D6): two parts on the CPU both draw dropout masks; under one
// seed the forward is the same every time, whatever order the threads run in.
TEST(LocalPipeline, DropoutIsReproducibleUnderAFixedSeed) {
  torch::manual_seed(1);
  torch::nn::Sequential model;
  model->push_back("fc0", torch::nn::Linear(64, 128));
  model->push_back("drop0", torch::nn::Dropout(0.5));
  model->push_back("fc1", torch::nn::Linear(128, 128));
  model->push_back("drop1", torch::nn::Dropout(0.5));
  LocalPipeline pipe(split_by_balance(model, {2, 2}), {c10::Device("cpu"), c10::Device("cpu")},
                     LocalPipelineOptions().microbatches(16));
  auto x = torch::randn({256, 64});
  std::vector<at::Tensor> outs;
  for (int trial = 0; trial < 4; ++trial) {
    torch::manual_seed(42);
    outs.push_back(pipe.forward(x).detach());
  }
  for (int trial = 1; trial < 4; ++trial) EXPECT_TRUE(torch::equal(outs[trial], outs[0])) << "trial " << trial;
  EXPECT_FALSE(torch::equal(pipe.forward(x), outs[0]));  // a later call draws other masks
}

TEST(LocalPipeline, AFailingPartIsNamedWithItsDevice) {
  auto model = mlp();
  LocalPipeline pipe(split_by_balance(model, {2, 3}), {c10::Device("cpu"), c10::Device("cpu")},
                     LocalPipelineOptions().microbatches(2));
  auto wrong = torch::randn({4, 6}, torch::kDouble);  // fc1 wants 5 features
  try {
    pipe.forward(wrong);
    FAIL() << "no error";
  } catch (const cohort::Error& e) {
    EXPECT_NE(std::string(e.what()).find("part 0 on cpu"), std::string::npos) << e.what();
  }
}

TEST(LocalPipeline, RefusesMoreMicroBatchesThanRowsAndMismatchedDevices) {
  auto model = mlp();
  LocalPipeline pipe(split_by_balance(model, {2, 3}), {c10::Device("cpu"), c10::Device("cpu")},
                     LocalPipelineOptions().microbatches(8));
  EXPECT_THROW(pipe.forward(torch::randn({4, 5}, torch::kDouble)), cohort::ConfigError);
  EXPECT_THROW(LocalPipeline(split_by_balance(mlp(), {2, 3}), {c10::Device("cpu")}), cohort::ConfigError);
}

TEST(Split, ByBalanceByParametersAndAtNamedPoints) {
  auto model = mlp();
  auto parts = split_by_balance(model, {2, 3});
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1]->named_parameters().size(), 4u);
  EXPECT_TRUE(parts[1]->named_parameters().contains("fc2.weight"));  // the whole model's names
  EXPECT_EQ(parts[0]->named_parameters()["fc1.weight"].data_ptr(),
            model->named_parameters()["fc1.weight"].data_ptr());  // shared, not copied
  // fc1 96, fc2 272, fc3 51 parameters: the best 2-way cut puts fc1 alone (largest
  // part 323), the best 3-way cut fc2 alone (272).
  auto largest = [](const std::vector<torch::nn::Sequential>& ps) {
    std::int64_t worst = 0;
    for (const auto& p : ps) {
      std::int64_t n = 0;
      for (const auto& t : p->parameters()) n += t.numel();
      worst = std::max(worst, n);
    }
    return worst;
  };
  EXPECT_EQ(largest(split_by_parameters(model, 2)), 323);
  EXPECT_EQ(largest(split_by_parameters(model, 3)), 272);
  EXPECT_EQ(split_by_parameters(model, 5).size(), 5u);
  auto at = split_at(model, {"fc2", "fc3"});
  ASSERT_EQ(at.size(), 3u);
  EXPECT_EQ(at[2]->size(), 1u);
  EXPECT_THROW(split_by_balance(model, {2, 2}), cohort::ConfigError);
  EXPECT_THROW(split_at(model, {"nope"}), cohort::ConfigError);
  EXPECT_THROW(split_at(model, {"fc3", "fc2"}), cohort::ConfigError);
  EXPECT_THROW(balance_by_parameters(model, 6), cohort::ConfigError);
}

}  // namespace
