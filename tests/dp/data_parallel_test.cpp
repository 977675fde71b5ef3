// DataParallel over CPU replicas in one process (dp/data_parallel.h): the gradients and
// weights equal one module on the whole batch, replicas follow the module, buffers come
// from replica 0, a failing replica is named, the caller's autocast and grad mode
// reach the replica threads, a module changed after building is replicated again,
// and dropout in CPU replicas is reproducible and recomputed exactly.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/amp/autocast.h"
#include "cohort/dp/data_parallel.h"
#include "cohort/errors.h"
#include "cohort/recompute/checkpoint.h"

#include <chrono>
#include <functional>
#include <random>
#include <thread>

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
  // Dropout at p = 0.5 would zero about half the outputs and double the rest, so
  // a tight tolerance still fails if any replica kept training mode. Bitwise
  // equality does not hold: the replicas multiply 3-row chunks and the reference
  // the 6-row whole, and LibTorch 2.x may pick a different GEMM kernel for each.
  EXPECT_TRUE(torch::allclose(dp(x), model->forward(x), 1e-5, 1e-6));  // no dropout anywhere
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

// PyTorch replicates at every call; here a module changed after building is
// replicated again (Note [Replicas made again]), and then equals one module.
void expect_late_change_followed(const std::function<void(torch::nn::Sequential&)>& change, torch::Dtype dtype) {
  auto model = make_model(), reference = make_model();
  DataParallel<torch::nn::Sequential> dp(model, DataParallelOptions(cpus(3)));
  dp(torch::randn({5, 6}, torch::kDouble)).sum().backward();  // replicas made and used
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  change(model);
  change(reference);
  auto x = torch::randn({7, 6}, dtype);
  auto out = dp(x), ref = reference->forward(x);
  ASSERT_EQ(out.scalar_type(), dtype);
  const double tolerance = dtype == torch::kDouble ? kTolerance : 1e-5;
  EXPECT_LT((out - ref).abs().max().item<double>(), tolerance);
  out.pow(2).sum().backward();
  ref.pow(2).sum().backward();
  std::vector<torch::Tensor> got, want;
  for (auto& p : model->parameters())
    if (p.grad().defined()) got.push_back(p.grad());
  for (auto& p : reference->parameters())
    if (p.grad().defined()) want.push_back(p.grad());
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(max_diff(got, want), tolerance);
  for (std::size_t r = 1; r < dp.replica_count(); ++r) {
    EXPECT_EQ(dp.replica(r)->parameters().size(), model->parameters().size());
    EXPECT_EQ(dp.replica(r)->buffers().size(), model->buffers().size());
  }
}

// A module that gains a buffer and a parameter after the DataParallel was built, made
// by reset() (so clone() can copy them) once grow() set its flags.
struct GrowingImpl : torch::nn::Cloneable<GrowingImpl> {
  GrowingImpl() { reset(); }
  void reset() override {
    lin = register_module("lin", torch::nn::Linear(6, 3));
    lin->to(torch::kDouble);
    if (with_buffer) scale = register_buffer("scale", torch::linspace(0.5, 1.5, 3, torch::kDouble));
    if (with_parameter) shift = register_parameter("shift", torch::linspace(-1, 1, 3, torch::kDouble));
  }
  void grow(bool buffer) {
    if (buffer) {
      with_buffer = true;
      scale = register_buffer("scale", torch::linspace(0.5, 1.5, 3, torch::kDouble));
    } else {
      with_parameter = true;
      shift = register_parameter("shift", torch::linspace(-1, 1, 3, torch::kDouble));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = lin(x);
    if (with_buffer) y = y * scale;
    if (with_parameter) y = y + shift;
    return y;
  }
  bool with_buffer = false, with_parameter = false;
  torch::nn::Linear lin{nullptr};
  torch::Tensor scale, shift;
};
TORCH_MODULE(Growing);

void expect_growth_followed(bool buffer) {
  torch::manual_seed(4);
  Growing model;
  DataParallel<Growing> dp(model, DataParallelOptions(cpus(3)));
  dp(torch::randn({5, 6}, torch::kDouble)).sum().backward();  // replicas made and used
  model->zero_grad();
  model->grow(buffer);
  auto x = torch::randn({7, 6}, torch::kDouble);
  auto out = dp(x);
  for (std::size_t r = 1; r < dp.replica_count(); ++r) {
    EXPECT_EQ(dp.replica(r)->parameters().size(), model->parameters().size());
    EXPECT_EQ(dp.replica(r)->buffers().size(), model->buffers().size());
  }
  out.pow(2).sum().backward();
  auto got = grads_of(*model);
  model->zero_grad();
  auto ref = model->forward(x);
  EXPECT_LT((out - ref).abs().max().item<double>(), kTolerance);
  ref.pow(2).sum().backward();
  EXPECT_LT(max_diff(got, grads_of(*model)), kTolerance);  // the late parameter's included
}

TEST(DataParallel, ABufferRegisteredAfterBuildingReachesTheReplicas) { expect_growth_followed(/*buffer=*/true); }
TEST(DataParallel, AParameterRegisteredAfterBuildingReachesTheReplicas) { expect_growth_followed(/*buffer=*/false); }

// Registered outside reset(), a tensor cannot be cloned: refused, naming it.
TEST(DataParallel, ATensorRegisteredOutsideResetAfterBuildingIsRefusedByName) {
  for (const bool buffer : {true, false}) {
    Growing model;
    DataParallel<Growing> dp(model, DataParallelOptions(cpus(2)));
    dp(torch::randn({4, 6}, torch::kDouble));
    if (buffer)
      model->register_buffer("late", torch::full({100}, 7.0));
    else
      model->register_parameter("late", torch::full({100}, 7.0));
    try {
      dp(torch::randn({4, 6}, torch::kDouble));
      ADD_FAILURE() << "no error";
    } catch (const cohort::ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("now ") + (buffer ? "buffer" : "parameter") + " late [100]"), std::string::npos)
          << what;
      EXPECT_NE(what.find("register every parameter and buffer in reset()"), std::string::npos) << what;
    }
  }
}

TEST(DataParallel, AModuleMovedToAnotherDtypeAfterBuildingIsFollowed) {
  expect_late_change_followed([](torch::nn::Sequential& m) { m->to(torch::kFloat); }, torch::kFloat);
}

TEST(DataParallel, ChangingRequiresGradAfterBuildingIsFollowed) {
  expect_late_change_followed([](torch::nn::Sequential& m) { m->parameters()[0].requires_grad_(false); },
                              torch::kDouble);
  // and back: the replicas' gradients reach it again
  auto model = make_model(), reference = make_model();
  model->parameters()[0].requires_grad_(false);
  DataParallel<torch::nn::Sequential> dp(model, DataParallelOptions(cpus(2)));
  dp(torch::randn({4, 6}, torch::kDouble));
  model->parameters()[0].requires_grad_(true);
  auto x = torch::randn({4, 6}, torch::kDouble);
  dp(x).sum().backward();
  reference->forward(x).sum().backward();
  EXPECT_LT(max_diff(grads_of(*model), grads_of(*reference)), kTolerance);
}

// Note [One CPU generator per replica]. A dropout whose draw comes after a random
// pause, so that the replica threads draw in an order the scheduler picks: the
// worst case, made likely.
struct JitterDropoutImpl : torch::nn::Cloneable<JitterDropoutImpl> {
  explicit JitterDropoutImpl(bool checkpointed = false) : checkpointed(checkpointed) { reset(); }
  void reset() override { lin = register_module("lin", torch::nn::Linear(16, 16)); }
  torch::Tensor segment(const torch::Tensor& x) {
    auto h = lin(x);
    if (!torch::GradMode::is_enabled() || !checkpointed) {  // the forward, not a recomputation
      thread_local std::minstd_rand jitter{std::random_device{}()};
      std::this_thread::sleep_for(std::chrono::microseconds(jitter() % 3000));
    }
    return torch::dropout(h, 0.5, is_training());
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (!checkpointed) return segment(x);
    return cohort::recompute::checkpoint([this](const cohort::recompute::TensorList& in) { return cohort::recompute::TensorList{segment(in[0])}; },
                                         {x}, cohort::recompute::CheckpointOptions().modules({lin.ptr()}))[0];
  }
  bool checkpointed;
  torch::nn::Linear lin{nullptr};
};
TORCH_MODULE(JitterDropout);

// The gradients of a checkpointed dropout in each replica are those of the masks the
// forward drew (read off its output's zeros): the one module on the whole batch with
// those masks.
void expect_checkpointed_dropout_exact(int replicas) {
  torch::manual_seed(5);
  JitterDropout model(/*checkpointed=*/true);
  model->to(torch::kDouble);
  DataParallel<JitterDropout> dp(model, DataParallelOptions(cpus(replicas)));
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({12, 16}, torch::kDouble).requires_grad_(true);
    model->zero_grad();
    auto y = dp(x);
    auto g = torch::randn_like(y);
    (y * g).sum().backward();
    // The reference: the module itself, unreplicated, with the forward's masks.
    auto x_ref = x.detach().clone().requires_grad_(true);
    auto lin_ref = std::dynamic_pointer_cast<torch::nn::LinearImpl>(model->lin->clone());
    auto mask = (y.detach() != 0).to(torch::kDouble) * 2.0;
    ((lin_ref->forward(x_ref) * mask) * g).sum().backward();
    EXPECT_LT((x.grad() - x_ref.grad()).abs().max().item<double>(), kTolerance) << replicas << " replicas, step " << step;
    EXPECT_LT(max_diff(grads_of(*model), grads_of(*lin_ref)), kTolerance) << replicas << " replicas, step " << step;
  }
}

TEST(DataParallel, CheckpointedDropoutInTwoCpuReplicasRecomputesTheForwardsMasks) {
  expect_checkpointed_dropout_exact(2);
}
TEST(DataParallel, CheckpointedDropoutInThreeCpuReplicasRecomputesTheForwardsMasks) {
  expect_checkpointed_dropout_exact(3);
}

TEST(DataParallel, DropoutInCpuReplicasIsReproducibleUnderASeed) {
  torch::manual_seed(5);
  JitterDropout model;
  DataParallel<JitterDropout> dp(model, DataParallelOptions(cpus(3)));
  auto x = torch::randn({12, 16});
  int differ = 0;
  for (int t = 0; t < 8; ++t) {
    torch::manual_seed(42 + t);
    auto a = dp(x);
    torch::manual_seed(42 + t);
    auto b = dp(x);
    differ += torch::equal(a, b) ? 0 : 1;
    EXPECT_GT((a == 0).sum().item<int64_t>(), 0);  // dropout did drop
  }
  EXPECT_EQ(differ, 0) << "of 8 pairs of forwards under the same seed";
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
