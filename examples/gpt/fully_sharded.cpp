// --zero 3: each transformer block is a cohort::zero::FullyShard unit, the whole
// model too, and fully_shard() keeps 1/D of every parameter (of this rank's TP
// slices) on each of the D data-parallel replicas, gathering a block's just before
// it computes (docs/zero.md). The optimizer is a FullyShardedOptimizer over the
// shards (optimizer.cpp). The TP group is untouched: ranks of one data group hold
// the same TP slice, so sharding over it is sharding plain tensors.
#include "strategy.h"

namespace gpt {
namespace {

class FullySharded : public Strategy {
 public:
  FullySharded(Gpt model, cohort::comm::DeviceMesh& mesh)
      : model_(std::move(model)),
        root_(with_units(model_)),
        sharded_(cohort::zero::fully_shard(root_, mesh.group(cohort::comm::MeshDim::kData))) {}

  torch::nn::Module& model() override { return *root_; }
  GptImpl& gpt() override { return *model_; }
  at::Tensor forward(const at::Tensor& ids) override { return root_(ids); }
  const cohort::zero::FullyShardedModel* fully_sharded() const override { return &sharded_; }
  std::string name() const override { return "zero3_reduce_scatter"; }

 private:
  static cohort::zero::FullyShard<GptImpl> with_units(Gpt& model) {
    model->use_fully_shard_units();
    return cohort::zero::FullyShard<GptImpl>(model.ptr());
  }

  Gpt model_;
  cohort::zero::FullyShard<GptImpl> root_;
  cohort::zero::FullyShardedModel sharded_;
};

}  // namespace

std::unique_ptr<Strategy> make_fully_sharded(Gpt model, cohort::comm::DeviceMesh& mesh) {
  return std::make_unique<FullySharded>(std::move(model), mesh);
}

}  // namespace gpt
