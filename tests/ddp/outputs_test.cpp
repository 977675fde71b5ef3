// What a forward returns: outputs the loss ignores (find_unused_parameters,
// static_graph) and the result types DDP finds tensors in.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <optional>

#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "ddp/reference.h"
#include "support/thread_world.h"

namespace {
using cohort::ddp::DistributedDataParallel;
using cohort::ddp::DistributedDataParallelOptions;
using cohort::testing::max_grad_error;
using cohort::testing::run_thread_world;

// Two heads over one trunk; the loss below uses only the first.
struct TwoHeadsImpl : torch::nn::Cloneable<TwoHeadsImpl> {
  TwoHeadsImpl() { reset(); }
  void reset() override {
    trunk = register_module("trunk", torch::nn::Linear(4, 4));
    head = register_module("head", torch::nn::Linear(4, 2));
    aux = register_module("aux", torch::nn::Linear(4, 2));
  }
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    auto h = trunk(x);
    return {head(h), aux(h)};
  }
  torch::nn::Linear trunk{nullptr}, head{nullptr}, aux{nullptr};
};
TORCH_MODULE(TwoHeads);

// The reference: one process, the whole batch, the same loss. The ignored head's
// gradients are zero (PyTorch's DDP gives zeros too).
std::vector<torch::Tensor> head_only_grads(TwoHeads model, const torch::Tensor& x) {
  model->zero_grad();
  std::get<0>(model->forward(x)).pow(2).mean().backward();
  std::vector<torch::Tensor> out;
  for (auto& p : model->parameters())
    out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  return out;
}

class IgnoredOutput : public ::testing::TestWithParam<const char*> {};

TEST_P(IgnoredOutput, AnOutputTheLossIgnoresIsAnUnusedParameterNotAnError) {
  const std::string mode = GetParam();
  torch::manual_seed(0);
  TwoHeads reference;
  auto x = torch::randn({3, 6, 4});  // [step][rows]
  std::vector<std::vector<torch::Tensor>> expected;
  for (int step = 0; step < 3; ++step) expected.push_back(head_only_grads(reference, x[step]));
  run_thread_world(2, [&](cohort::comm::World& world) {
    auto model = std::dynamic_pointer_cast<TwoHeadsImpl>(reference->clone());
    auto o = DistributedDataParallelOptions().bucket_cap_bytes(40);  // several buckets
    if (mode == "find_unused") o.find_unused_parameters(true);
    if (mode == "static_graph") o.static_graph(true);
    if (mode == "view") o.find_unused_parameters(true).gradient_as_bucket_view(true);
    DistributedDataParallel ddp(TwoHeads(model), world.group(), o);
    for (int step = 0; step < 3; ++step) {
      ddp.module()->zero_grad();
      auto [a, b] = ddp(x[step].chunk(2)[world.rank()]);
      a.pow(2).mean().backward();
      EXPECT_LT(max_grad_error(ddp.module()->parameters(), expected[step]), 1e-6)
          << mode << " rank " << world.rank() << " step " << step;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, IgnoredOutput, ::testing::Values("find_unused", "static_graph", "view"));

// A forward returning std::array / std::optional: DDP must see its tensors, or
// find_unused_parameters thinks every parameter unused.
struct ArrayOutImpl : torch::nn::Cloneable<ArrayOutImpl> {
  ArrayOutImpl() { reset(); }
  void reset() override {
    a = register_module("a", torch::nn::Linear(4, 4));
    b = register_module("b", torch::nn::Linear(4, 4));
  }
  std::array<torch::Tensor, 2> forward(const torch::Tensor& x) { return {a(x), b(x)}; }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(ArrayOut);

struct OptionalOutImpl : torch::nn::Cloneable<OptionalOutImpl> {
  OptionalOutImpl() { reset(); }
  void reset() override { a = register_module("a", torch::nn::Linear(4, 4)); }
  std::optional<torch::Tensor> forward(const torch::Tensor& x) { return a(x); }
  torch::nn::Linear a{nullptr};
};
TORCH_MODULE(OptionalOut);

template <typename Module, typename Loss>
void expect_average_of_local_grads(Loss loss) {
  torch::manual_seed(1);
  Module reference;
  auto x = torch::randn({6, 4});
  reference->zero_grad();
  loss(reference->forward(x)).backward();
  std::vector<torch::Tensor> expected;
  for (auto& p : reference->parameters()) expected.push_back(p.grad().clone());
  run_thread_world(2, [&](cohort::comm::World& world) {
    auto model = std::dynamic_pointer_cast<typename Module::Impl>(reference->clone());
    DistributedDataParallel ddp(Module(model), world.group(),
                                DistributedDataParallelOptions().find_unused_parameters(true));
    for (int step = 0; step < 2; ++step) {
      ddp.module()->zero_grad();
      loss(ddp(x.chunk(2)[world.rank()])).backward();
      EXPECT_LT(max_grad_error(ddp.module()->parameters(), expected), 1e-6) << "rank " << world.rank();
    }
  });
}

TEST(OutputTypes, StdArrayOutputsAreWalkedForUnusedParameters) {
  expect_average_of_local_grads<ArrayOut>(
      [](const std::array<torch::Tensor, 2>& out) { return out[0].pow(2).mean() + out[1].pow(2).mean(); });
}

TEST(OutputTypes, StdOptionalOutputsAreWalkedForUnusedParameters) {
  expect_average_of_local_grads<OptionalOut>(
      [](const std::optional<torch::Tensor>& out) { return out->pow(2).mean(); });
}

}  // namespace

// A type of the user's own, described by an overload found by argument-dependent lookup.
namespace custom {
struct Output {
  torch::Tensor logits;
  std::vector<torch::Tensor> features;
};
void collect_tensors(const Output& o, std::vector<at::Tensor>& out) {
  out.push_back(o.logits);
  cohort::ddp::append_tensors(o.features, out);
}
struct Opaque {
  torch::Tensor hidden;
};
}  // namespace custom

namespace {
using cohort::ddp::knows_tensors_in_v;
// What DistributedDataParallel::forward accepts as a result type, at compile time:
// an unknown type (or a container of one) fails to compile (tensors_in_result's
// static_assert) instead of silently holding no tensor.
static_assert(knows_tensors_in_v<torch::Tensor>);
static_assert(knows_tensors_in_v<std::array<torch::Tensor, 2>>);
static_assert(knows_tensors_in_v<std::optional<torch::Tensor>>);
static_assert(knows_tensors_in_v<c10::optional<torch::Tensor>>);
static_assert(knows_tensors_in_v<std::tuple<torch::Tensor, std::vector<torch::Tensor>, int>>);
static_assert(knows_tensors_in_v<std::map<std::string, std::pair<torch::Tensor, double>>>);
static_assert(knows_tensors_in_v<std::variant<torch::Tensor, std::deque<torch::Tensor>>>);
static_assert(knows_tensors_in_v<custom::Output>);
static_assert(knows_tensors_in_v<std::vector<custom::Output>>);
static_assert(!knows_tensors_in_v<custom::Opaque>);
static_assert(!knows_tensors_in_v<std::vector<custom::Opaque>>);
static_assert(!knows_tensors_in_v<std::tuple<torch::Tensor, custom::Opaque>>);

TEST(OutputTypes, EveryTensorOfNestedKnownTypesAndUserTypesIsFound) {
  auto t = [](double v) { return torch::full({1}, v); };
  std::tuple<std::array<torch::Tensor, 2>, std::optional<torch::Tensor>, std::map<int, torch::Tensor>,
             std::variant<int, torch::Tensor>, custom::Output, std::string>
      result{{t(1), t(2)}, t(3), {{7, t(4)}}, t(5), custom::Output{t(6), {t(7), t(8)}}, "label"};
  auto found = cohort::ddp::tensors_in_result(result);
  ASSERT_EQ(found.size(), 8u);
  for (std::size_t i = 0; i < found.size(); ++i) EXPECT_EQ(found[i].item<double>(), i + 1.0);
  // Arguments of unknown types are skipped, not refused.
  EXPECT_EQ(cohort::ddp::tensors_in(t(1), custom::Opaque{t(2)}, 3).size(), 1u);
}

}  // namespace
