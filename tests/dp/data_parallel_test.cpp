// DataParallel over CPU replicas in one process (dp/data_parallel.h): the gradients and
// weights equal one module on the whole batch, replicas follow the module, buffers come
// from replica 0, a failing replica is named, and the caller's autocast and grad mode
// reach the replica threads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/amp/autocast.h"
#include "cohort/dp/data_parallel.h"
#include "cohort/errors.h"

namespace {

using cohort::dp::DataParallel;
using cohort::dp::DataParallelOptions;

constexpr double kTolerance = 1e-12;  // float64: only the summation order differs

torch::nn::Sequential make_model() {
  torch::manual_seed(13);
  torch::nn::Sequential m(torch::nn::Linear(6, 12), torch::nn::Tanh(), torch::nn::Linear(12, 3));
  m->to(torch::kDouble);
  return m;
}

std::vector<c10::Device> cpus(int n) { return std::vector<c10::Device>(static_cast<std::size_t>(n), c10::kCPU); }

double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
}

std::vector<torch::Tensor> grads_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.grad().clone());
  return out;
}

void expect_equal_to_one_module(int replicas, int rows) {
  auto model = make_model();
  auto reference = make_model();
  DataParallel<torch::nn::Sequential> dp(model, DataParallelOptions(cpus(replicas)));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 4; ++step) {
    auto x = torch::randn({rows, 6}, torch::kDouble);
    auto y = torch::randint(0, 3, {rows});
    opt.zero_grad();
    ref_opt.zero_grad();
    torch::nn::functional::cross_entropy(dp(x), y).backward();
    torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
    EXPECT_LT(max_diff(grads_of(*model), grads_of(*reference)), kTolerance) << "step " << step;
    opt.step();
    ref_opt.step();
  }
  EXPECT_LT(max_diff(model->parameters(), reference->parameters()), kTolerance);
  // The replicas follow the module and keep no gradients of their own.
  dp.synchronize();
  for (std::size_t r = 1; r < dp.replica_count(); ++r) {
    auto theirs = dp.replica(r)->parameters();
    for (std::size_t k = 0; k < theirs.size(); ++k) {
      EXPECT_TRUE(torch::equal(theirs[k], model->parameters()[k])) << "replica " << r << " parameter " << k;
      EXPECT_FALSE(theirs[k].grad().defined());
    }
  }
}

TEST(DataParallel, TwoReplicasEqualOneModuleOnTheWholeBatch) { expect_equal_to_one_module(2, 10); }
TEST(DataParallel, ThreeReplicasWithAnUnevenLastChunk) { expect_equal_to_one_module(3, 11); }
TEST(DataParallel, ABatchSmallerThanTheReplicaCount) { expect_equal_to_one_module(3, 2); }

TEST(DataParallel, ReplicasAreMadeOnceNotPerCall) {
  auto model = make_model();
  DataParallel<torch::nn::Sequential> dp(model, DataParallelOptions(cpus(2)));
  auto before = dp.replica(1)->parameters()[0].data_ptr();
  dp(torch::randn({4, 6}, torch::kDouble)).sum().backward();
  torch::optim::SGD(model->parameters(), 0.1).step();
  dp(torch::randn({4, 6}, torch::kDouble));
  EXPECT_EQ(dp.replica(1)->parameters()[0].data_ptr(), before);
  EXPECT_TRUE(torch::equal(dp.replica(1)->parameters()[0], model->parameters()[0]));
}

TEST(DataParallel, BuffersComeFromReplicaZero) {
  torch::manual_seed(2);
  torch::nn::Sequential model(torch::nn::Linear(4, 5), torch::nn::BatchNorm1d(5));
  torch::manual_seed(2);
  torch::nn::Sequential alone(torch::nn::Linear(4, 5), torch::nn::BatchNorm1d(5));
  DataParallel<torch::nn::Sequential> dp(model, DataParallelOptions(cpus(2)));
  auto x = torch::randn({8, 4});
  dp(x);
  alone->forward(x.narrow(0, 0, 4));  // replica 0's chunk
  auto bn = model[1]->as<torch::nn::BatchNorm1d>();
  auto ref = alone[1]->as<torch::nn::BatchNorm1d>();
  EXPECT_TRUE(torch::allclose(bn->running_mean, ref->running_mean));
  EXPECT_TRUE(torch::allclose(bn->running_var, ref->running_var));
  // The next forward (its synchronize) hands them to the other replicas.
  dp.synchronize();
  EXPECT_TRUE(torch::equal(dp.replica(1)->buffers()[0], model->buffers()[0]));
}

TEST(DataParallel, EvalModeReachesTheReplicas) {
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Linear(4, 4), torch::nn::Dropout(0.5));
  DataParallel<torch::nn::Sequential> dp(model, DataParallelOptions(cpus(2)));
  model->eval();
  auto x = torch::randn({6, 4});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(dp(x), model->forward(x)));  // no dropout anywhere
  EXPECT_FALSE(dp.replica(1)->is_training());
}

// Two forwards, then one backward over both (siamese and contrastive losses).
TEST(DataParallel, TwoForwardsBeforeOneBackward) {
  auto model = make_model(), reference = make_model();
  DataParallel<torch::nn::Sequential> dp(model, DataParallelOptions(cpus(2)));
  auto a = torch::randn({6, 6}, torch::kDouble), b = torch::randn({6, 6}, torch::kDouble);
  (dp(a).sum() + dp(b).pow(2).sum()).backward();
  (reference->forward(a).sum() + reference->forward(b).pow(2).sum()).backward();
  EXPECT_LT(max_diff(grads_of(*model), grads_of(*reference)), kTolerance);
}

TEST(DataParallel, ChangingRequiresGradAfterBuildingIsRefused) {
  auto model = make_model();
  model->parameters()[0].requires_grad_(false);
  DataParallel<torch::nn::Sequential> dp(model, DataParallelOptions(cpus(2)));
  model->parameters()[0].requires_grad_(true);
  try {
    dp(torch::randn({4, 6}, torch::kDouble));
    FAIL() << "no error";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("started requiring gradients"), std::string::npos) << e.what();
  }
}

struct PickyImpl : torch::nn::Cloneable<PickyImpl> {
  PickyImpl() { reset(); }
  void reset() override { layer = register_module("layer", torch::nn::Linear(3, 3)); }
  torch::Tensor forward(torch::Tensor x) {
    if (x.size(0) == 2) throw std::runtime_error("two rows are too few for this layer");
    return layer(x);
  }
  torch::nn::Linear layer{nullptr};
};
TORCH_MODULE(Picky);

TEST(DataParallel, AFailingReplicaIsNamed) {
  Picky model;
  DataParallel<Picky> dp(model, DataParallelOptions(cpus(2)));
  try {
    dp(torch::randn({5, 3}));  // chunks of 3 and 2 rows
    FAIL() << "no error";
  } catch (const cohort::Error& e) {
    EXPECT_NE(std::string(e.what()).find("replica 1 on cpu failed in forward: two rows are too few"),
              std::string::npos)
        << e.what();
  }
}

TEST(DataParallel, TheCallersAutocastAndGradModeReachTheReplicas) {
  torch::manual_seed(1);
  torch::nn::Sequential model(torch::nn::Linear(4, 4));
  DataParallel<torch::nn::Sequential> dp(model, DataParallelOptions(cpus(3)));
  auto x = torch::randn({6, 4});
  {
    cohort::amp::Autocast autocast{cohort::amp::AutocastOptions(torch::kCPU)};
    EXPECT_EQ(dp(x).scalar_type(), torch::kBFloat16);  // a float32 chunk would have promoted the result
  }
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(dp(x).requires_grad());
}

struct NotCloneableImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x; }
};
TORCH_MODULE(NotCloneable);

TEST(DataParallel, AModuleThatCannotBeClonedIsRefused) {
  NotCloneable model;
  try {
    DataParallel<NotCloneable> dp(model, DataParallelOptions(cpus(2)));
    FAIL() << "no error";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("torch::nn::Cloneable"), std::string::npos) << e.what();
  }
  EXPECT_THROW(DataParallel<NotCloneable>(model, DataParallelOptions(std::vector<c10::Device>{})),
               cohort::ConfigError);
}

}  // namespace
