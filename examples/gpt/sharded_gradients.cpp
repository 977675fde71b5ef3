// --zero 2: the TP-split model on every data-parallel replica, not wrapped in DDP.
// The optimizer (cohort::zero::ShardedOptimizer with shard_gradients over the
// mesh's data group, made in optimizer.cpp) broadcasts replica 0's weights and
// reduces each gradient during backward to the replica that owns its parameter.
#include "strategy.h"

namespace gpt {
namespace {

class ShardedGradients : public Strategy {
 public:
  explicit ShardedGradients(Gpt model) : model_(std::move(model)) {}

  torch::nn::Module& model() override { return *model_; }
  GptImpl& gpt() override { return *model_; }
  at::Tensor forward(const at::Tensor& ids) override { return model_(ids); }
  std::string name() const override { return "zero2_reduce_to_owners"; }

 private:
  Gpt model_;
};

}  // namespace

std::unique_ptr<Strategy> make_sharded_gradients(Gpt model, cohort::comm::DeviceMesh&) {
  return std::make_unique<ShardedGradients>(std::move(model));
}

}  // namespace gpt
