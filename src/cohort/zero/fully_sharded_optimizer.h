#pragma once
// The optimizer of a ZeRO-3 model (zero/fully_shard.h): any torch::optim optimizer
// over this rank's shards, which saves and loads its state whole, as one optimizer
// over the unsharded model's parameters would hold it. A checkpoint of a fully
// sharded run then resumes at any world size, and under DDP or ZeRO-1/2 as well.
//
//   auto sharded = cohort::zero::fully_shard(net, world.group());
//   cohort::zero::FullyShardedOptimizer optimizer(sharded, [](std::vector<torch::Tensor> p) {
//     return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-3));
//   });
//   ...
//   { auto full = sharded.full_parameters();  ckpt.save(*net, optimizer, progress, device); }
//   (a save outside full_parameters() is refused: the parameters hold nothing there)
//   { auto full = sharded.full_parameters(/*write_back=*/true);
//     ckpt.load_latest(*net, optimizer, device); }
//
// A plain optimizer over sharded.parameters() trains just as well; it cannot be
// checkpointed, since each rank's state is of its own shards.
//
// Note [ZeRO-3 optimizer state]
// The wrapped optimizer updates each element of a shard from that element's
// gradient and state alone (true of torch::optim's optimizers but LBFGS), so a
// state tensor shaped like a shard is the shard's slice of a state shaped like the
// flat parameter. Saving all-gathers each such tensor and cuts it at the original
// parameters' offsets; other state (Adam's step count) is the same for every
// element and is copied. Loading does the reverse: each rank lays the saved
// per-parameter tensors end to end and keeps its chunk. The state is read and
// written through each state's own serialize() methods, so every optimizer whose
// state is made of such tensors and scalars works without cohort knowing its type.
// "Whole" means one optimizer over the model's parameters, each once, in
// module.parameters() order, frozen ones included (they hold no state):
// ShardSchedule::whole_order().
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "cohort/checkpoint/gathered_state.h"
#include "cohort/zero/fully_shard.h"
#include "cohort/zero/sharded_optimizer.h"

namespace cohort::zero {

class FullyShardedOptimizer : public torch::optim::Optimizer, public checkpoint::GathersStateForSave {
 public:
  // `make` builds the wrapped optimizer over the parameters given (the shards now;
  // stand-ins shaped as the whole model when saving or loading).
  FullyShardedOptimizer(FullyShardedModel model, OptimizerFactory make);

  // Local: the shards' gradients are already reduced. The options in force on this
  // optimizer's group (a learning-rate schedule) reach the wrapped one first.
  at::Tensor step(LossClosure closure = nullptr) override;

  // Collective (Note [ZeRO-3 optimizer state]): the whole state to group rank `to`,
  // whose save() then writes it. gather_state_for_save() takes a global rank.
  void gather_state(int to) const;
  void gather_state_for_save(int writer) const override;
  void release_gathered_state() const override;
  void save(torch::serialize::OutputArchive& archive) const override;
  // Every rank: a whole state (saved by this class at any world size, or by the
  // wrapped optimizer over the unsharded model) becomes this rank's shards' state.
  void load(torch::serialize::InputArchive& archive) override;

  torch::optim::Optimizer& wrapped() { return *local_; }
  const FullyShardedModel& model() const { return model_; }
  std::int64_t local_state_bytes() const;

 private:
  struct Made;
  struct Kept;  // Note [Unused parameters under ZeRO-3]
  FullyShardedOptimizer(FullyShardedModel model, OptimizerFactory make, Made made);
  std::vector<at::Tensor> stand_ins() const;

  FullyShardedModel model_;
  OptimizerFactory make_;
  std::unique_ptr<torch::optim::Optimizer> local_;
  mutable std::unique_ptr<torch::optim::Optimizer> gathered_;
};

}  // namespace cohort::zero
