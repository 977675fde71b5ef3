#include "whole_model.h"

#include <torch/nn/functional/loss.h>

#include "cohort/checkpoint/state_dict.h"
#include "checkpointing.h"
#include "cohort/data/to_device.h"

namespace fashion_mnist {

namespace {
FashionNet init(const TrainerOptions& o, c10::Device device) {
  torch::manual_seed(o.seed);
  FashionNet model;
  model->to(device);
  if (o.memory_format == "channels-last") model->use_channels_last();
  if (o.activation_checkpointing) model->use_activation_checkpointing();
  return model;
}
}  // namespace

WholeModel::WholeModel(const TrainerOptions& o, cohort::comm::World& world, c10::Device device)
    : world_(world), device_(device), model_(init(o, device)) {}

at::Tensor WholeModel::step_through(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                                const torch::Tensor& data, const torch::Tensor& target, MixedPrecision& precision,
                                cohort::trace::StepProfiler& profiler) {
  torch::Tensor loss;
  {
    auto p = profiler.phase("forward");
    auto autocast = precision.autocast();
    loss = torch::nn::functional::cross_entropy(forward(cohort::data::to_device(data, device_)),
                                                cohort::data::to_device(target, device_));
  }
  auto p = profiler.phase("backward");
  precision.scale(loss).backward();
  return loss.detach();
}

Evaluation WholeModel::evaluate(cohort::data::FashionMnist& test) {
  return fashion_mnist::evaluate(model_, test, world_.group(), device_);
}

std::unique_ptr<cohort::checkpoint::Checkpointer> WholeModel::checkpointer(const TrainerOptions& o) {
  // With --zero each rank saves its own optimizer shard; nothing is gathered
  // (docs/zero.md#sharded-checkpoints). With --checkpoint-async too, the shards are
  // gathered to rank 0, whose writer thread writes them (docs/checkpoints.md).
  return std::make_unique<cohort::checkpoint::Checkpointer>(
      o.checkpoint_dir, world_.group(),
      checkpointer_options(o).shard_optimizer_state(o.zero > 0 && !o.checkpoint_async &&
                                                                   o.checkpoint_format != "dcp"));
}

std::optional<cohort::checkpoint::Restored> WholeModel::resume(cohort::checkpoint::Checkpointer& checkpointer,
                                                               torch::optim::Optimizer& optimizer) {
  return checkpointer.load_latest(*model_, optimizer, device_);
}

c10::Dict<std::string, at::Tensor> WholeModel::final_state() {
  return world_.rank() == 0 ? cohort::checkpoint::state_dict(*model_) : c10::Dict<std::string, at::Tensor>();
}

}  // namespace fashion_mnist
