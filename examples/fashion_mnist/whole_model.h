#pragma once
// What the strategies that keep the whole model in each process share (DDP across
// processes, DataParallel's replicas inside one): the model, its evaluation, its
// checkpoints and its final state dict.
#include <functional>

#include "model.h"
#include "strategy.h"

namespace fashion_mnist {

class WholeModel : public Strategy {
 public:
  WholeModel(const TrainerOptions& o, cohort::comm::World& world, c10::Device device);

  torch::nn::Module& model() override { return *model_; }
  int replicas() const override { return world_.size(); }
  int replica() const override { return world_.rank(); }
  Evaluation evaluate(cohort::data::FashionMnist& test) override;
  std::unique_ptr<cohort::checkpoint::Checkpointer> checkpointer(const TrainerOptions& o) override;
  std::optional<cohort::checkpoint::Restored> resume(cohort::checkpoint::Checkpointer& checkpointer,
                                                     torch::optim::Optimizer& optimizer) override;
  c10::Dict<std::string, at::Tensor> final_state() override;

 protected:
  // A step through `forward` (DDP's, DataParallel's): autocast around the forward and
  // the loss, then backward of the scaled loss. Returns the loss, detached.
  at::Tensor step_through(const std::function<torch::Tensor(const torch::Tensor&)>& forward, const torch::Tensor& data,
                      const torch::Tensor& target, MixedPrecision& precision, cohort::trace::StepProfiler& profiler);

  cohort::comm::World& world_;
  c10::Device device_;
  FashionNet model_;
};

}  // namespace fashion_mnist
