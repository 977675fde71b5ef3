// --zero 2: the whole model on every rank, not wrapped in DDP. The optimizer
// (cohort::zero::ShardedOptimizer with shard_gradients, made in optimizer.cpp)
// broadcasts rank 0's weights and reduces each gradient during backward to the rank
// that owns its parameter (docs/zero.md).
#include "whole_model.h"

namespace fashion_mnist {
namespace {

class ShardedGradients : public WholeModel {
 public:
  using WholeModel::WholeModel;

  at::Tensor forward_backward(const torch::Tensor& data, const torch::Tensor& target, MixedPrecision& precision,
                              cohort::trace::StepProfiler& profiler) override {
    return step_through([this](const torch::Tensor& x) { return model_->forward(x); }, data, target, precision,
                        profiler);
  }

  nlohmann::json summary() override { return {{"comm_hook", "zero2_reduce_to_owners"}}; }
};

}  // namespace

std::unique_ptr<Strategy> make_sharded_gradients(const TrainerOptions& o, cohort::comm::World& world,
                                                c10::Device device) {
  return std::make_unique<ShardedGradients>(o, world, device);
}

}  // namespace fashion_mnist
