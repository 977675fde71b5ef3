// DDP over segments checkpointed without .modules() (reentrant: the recomputation
// differentiates into .grad inside a backward of its own; Notes [Where backward
// ends] and [Parameters behind a custom function]). Ranks as threads; gradients
// against one process on the whole batch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <tuple>

#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/recompute/checkpoint.h"
#include "ddp/reference.h"
#include "support/thread_world.h"

namespace {
using cohort::ddp::DistributedDataParallel;
using cohort::ddp::DistributedDataParallelOptions;
using cohort::recompute::checkpoint;
using cohort::recompute::TensorList;
using cohort::testing::run_thread_world;

// pre -> block -> block2; `layout` says which parts are checkpointed without .modules().
struct SegmentedImpl : torch::nn::Cloneable<SegmentedImpl> {
  explicit SegmentedImpl(std::string layout = "plain") : layout(std::move(layout)) { reset(); }
  void reset() override {
    pre = register_module("pre", torch::nn::Linear(6, 6));
    block = register_module("block", torch::nn::Linear(6, 6));
    block2 = register_module("block2", torch::nn::Linear(6, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(pre(x));
    auto f1 = [this](const TensorList& in) { return TensorList{torch::tanh(block(in[0]))}; };
    auto f2 = [this](const TensorList& in) { return TensorList{block2(in[0])}; };
    if (layout == "plain") return block2(f1({h})[0]);
    if (layout == "checkpoint_then_plain") return block2(checkpoint(f1, {h})[0]);
    if (layout == "two_checkpoints") return checkpoint(f2, {checkpoint(f1, {h})[0]})[0];
    return checkpoint(f2, f1({h}))[0];  // "plain_then_checkpoint"
  }
  std::string layout;
  torch::nn::Linear pre{nullptr}, block{nullptr}, block2{nullptr};
};
TORCH_MODULE(Segmented);

class ReentrantCheckpoint : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(ReentrantCheckpoint, GradientsEqualOneProcessOnTheWholeBatch) {
  const auto [layout, mode] = GetParam();
  torch::manual_seed(1);
  Segmented reference;
  auto x = torch::randn({8, 6});
  reference->zero_grad();
  reference->forward(x).pow(2).mean().backward();
  std::vector<torch::Tensor> expected;
  for (auto& p : reference->parameters()) expected.push_back(p.grad().clone());
  run_thread_world(2, [&, layout = layout, mode = mode](cohort::comm::World& world) {
    auto model = std::dynamic_pointer_cast<SegmentedImpl>(reference->clone());
    model->layout = layout;
    // Small buckets: several of them, so that one reduced too early would show.
    auto options = DistributedDataParallelOptions().bucket_cap_bytes(100).first_bucket_cap_bytes(100);
    if (mode == "find_unused") options.find_unused_parameters(true);
    if (mode == "static_graph") options.static_graph(true);
    DistributedDataParallel ddp(Segmented(model), world.group(), options);
    for (int step = 0; step < 3; ++step) {  // the first step, the rebuild, and a step after it
      ddp.module()->zero_grad();
      ddp(x.chunk(2)[world.rank()]).pow(2).mean().backward();
      EXPECT_LT(cohort::testing::max_grad_error(ddp.module()->parameters(), expected), 1e-6)
          << layout << " " << mode << " rank " << world.rank() << " step " << step;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, ReentrantCheckpoint,
                         ::testing::Combine(::testing::Values("checkpoint_then_plain", "two_checkpoints",
                                                              "plain_then_checkpoint"),
                                            ::testing::Values("default", "find_unused", "static_graph")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
