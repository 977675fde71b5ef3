// --zero 3: each layer of the network is a cohort::zero::FullyShard unit, the whole
// network too, and fully_shard() keeps 1/N of every parameter on each rank,
// gathering a layer's just before it computes (docs/zero.md#zero-3-sharded-parameters).
// The optimizer is a FullyShardedOptimizer over the shards (optimizer.cpp);
// checkpoints hold the whole model and the whole optimizer state, as DDP's do.
#include "cohort/checkpoint/state_dict.h"
#include "checkpointing.h"
#include "whole_model.h"

namespace fashion_mnist {
namespace {

class FullySharded : public WholeModel {
 public:
  FullySharded(const TrainerOptions& o, cohort::comm::World& world, c10::Device device)
      : WholeModel(o, world, device),
        root_(with_units(model_)),
        sharded_(cohort::zero::fully_shard(root_, world.group())) {}

  torch::nn::Module& model() override { return *root_; }
  const cohort::zero::FullyShardedModel* fully_sharded() const override { return &sharded_; }

  at::Tensor forward_backward(const torch::Tensor& data, const torch::Tensor& target, MixedPrecision& precision,
                              cohort::trace::StepProfiler& profiler) override {
    return step_through([this](const torch::Tensor& x) { return root_(x); }, data, target, precision, profiler);
  }

  std::unique_ptr<cohort::checkpoint::Checkpointer> checkpointer(const TrainerOptions& o) override {
    return std::make_unique<cohort::checkpoint::Checkpointer>(
        o.checkpoint_dir, world_.group(), checkpointer_options(o));
  }
  std::optional<cohort::checkpoint::Restored> resume(cohort::checkpoint::Checkpointer& checkpointer,
                                                     torch::optim::Optimizer& optimizer) override {
    auto full = sharded_.full_parameters(/*write_back=*/true);
    return checkpointer.load_latest(*root_, optimizer, device_);
  }
  void save(cohort::checkpoint::Checkpointer& checkpointer, torch::optim::Optimizer& optimizer,
            const cohort::checkpoint::TrainingProgress& progress, c10::Device device) override {
    auto full = sharded_.full_parameters();
    checkpointer.save(*root_, optimizer, progress, device);
  }
  c10::Dict<std::string, at::Tensor> final_state() override {
    auto full = sharded_.full_parameters();
    c10::Dict<std::string, at::Tensor> out;
    if (world_.rank() != 0) return out;
    // Copies: the parameters are empty again once `full` is gone.
    for (const auto& entry : cohort::checkpoint::state_dict(*root_)) out.insert(entry.key(), entry.value().clone());
    return out;
  }
  nlohmann::json summary() override { return {{"comm_hook", "zero3_reduce_scatter"}}; }

 private:
  static cohort::zero::FullyShard<FashionNetImpl> with_units(FashionNet& net) {
    net->use_fully_shard_units();
    return cohort::zero::FullyShard<FashionNetImpl>(net.ptr());
  }

  cohort::zero::FullyShard<FashionNetImpl> root_;
  cohort::zero::FullyShardedModel sharded_;
};

}  // namespace

std::unique_ptr<Strategy> make_fully_sharded(const TrainerOptions& o, cohort::comm::World& world,
                                             c10::Device device) {
  return std::make_unique<FullySharded>(o, world, device);
}

}  // namespace fashion_mnist
