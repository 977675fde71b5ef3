#pragma once
// ZeRO stage 1: the optimizer's state is partitioned across the ranks of a group,
// so each rank holds about 1/N of it (Rajbhandari et al., "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models", 2020; PyTorch's
// ZeroRedundancyOptimizer).
//
//   cohort::ddp::DistributedDataParallel ddp(model, world.group());
//   cohort::zero::ShardedOptimizer opt(ddp.module()->parameters(), world.group(),
//       [](std::vector<torch::Tensor> shard) {
//         return std::make_unique<torch::optim::Adam>(shard, torch::optim::AdamOptions(1e-3));
//       });
//   for (...) { opt.zero_grad(); loss(ddp(x)).backward(); opt.step(); }
//
// Note [ZeRO-1 step]
// Every rank has the whole model and, after DDP's backward, the averaged gradients of
// every parameter. Each parameter has one owner (Note [Balanced partition] in
// zero/partition.h), and only the owner keeps its optimizer state: step() runs the
// wrapped optimizer over this rank's shard alone, then every owner broadcasts its
// updated parameters to the others, in buckets of bucket_cap_bytes. The wrapped
// optimizers of torch::optim update each parameter from its own gradient and state
// alone, so the result is bitwise what one optimizer over every parameter computes.
//
// It is a torch::optim::Optimizer: zero_grad() clears every parameter's gradient, a
// GradScaler steps it (amp/grad_scaler.h; every rank skips the same steps), and
// Checkpointer::save gathers the whole state to rank 0, which writes it in the
// wrapped optimizer's own format; load() on every rank takes back its shard, at any
// world size. Programs that save it themselves call gather_state(0) on every rank
// first. One parameter group: learning-rate changes go through set_lr().
//
// ZeRO stage 2 (shard_gradients(true)): the model is not wrapped in DDP. The
// optimizer broadcasts rank 0's parameters at construction, as DDP does, and
// reduces each gradient during backward to its parameter's owner alone (Note
// [ZeRO-2 gradients] in zero/gradient_sharder.h), so each rank keeps about 1/N of
// the gradients as well as of the state:
//
//   cohort::zero::ShardedOptimizer opt(model->parameters(), world.group(), make_adam,
//       cohort::zero::ShardedOptimizerOptions().shard_gradients(true));
//   for (...) { opt.zero_grad(); loss(model(x)).backward(); opt.step(); }
//   { auto guard = opt.no_sync(); loss(model(x1)).backward(); }  // accumulate locally
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "cohort/checkpoint/gathered_state.h"
#include "cohort/checkpoint/sharded_state.h"
#include "cohort/comm/group.h"
#include "cohort/zero/gradient_sharder.h"
#include "cohort/zero/options.h"

namespace cohort::zero {

// Makes the wrapped optimizer over the parameters given, with the user's options.
// Called once for this rank's shard, and when the whole state is gathered or loaded.
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

class ShardedOptimizer : public torch::optim::Optimizer,
                         public checkpoint::GathersStateForSave,
                         public checkpoint::SavesStateInShards {
 public:
  // Collective when check_replicas: every rank must pass the same parameters (a
  // parameter listed twice counts once), options and optimizer settings. Throws
  // ConfigError on every rank otherwise, and for a missing factory or an LBFGS.
  ShardedOptimizer(std::vector<at::Tensor> parameters, comm::Group group, OptimizerFactory make,
                   ShardedOptimizerOptions options = ShardedOptimizerOptions());
  ~ShardedOptimizer() override;

  // Collective: steps this rank's shard, then broadcasts every shard's parameters
  // from its owner. A closure, if given, is evaluated once, on every rank.
  at::Tensor step(LossClosure closure = nullptr) override;

  // The whole state, written by the rank that gather_state() gathered it to; any
  // other rank throws ConfigError saying so.
  void save(torch::serialize::OutputArchive& archive) const override;
  // Every rank: reads a whole state (saved by this class at any world size, or by
  // the wrapped optimizer itself) and keeps its own shard of it.
  void load(torch::serialize::InputArchive& archive) override;

  // Collective: the whole state to group rank `to`, whose save() then writes it.
  void gather_state(int to) const;
  void gather_state_for_save(int writer) const override;
  void release_gathered_state() const override;

  // Saving shard by shard (checkpoint/sharded_state.h): no rank gathers anything.
  // load_shards() reads only the saved shards that hold this rank's parameters and
  // throws ConfigError, leaving this optimizer unchanged, for a state of another model.
  checkpoint::ShardLayout shard_layout() const override;
  std::string shard_bytes() const override;
  void load_shards(const checkpoint::ShardLayout& saved, const std::function<std::string(int)>& shard) override;

  // The same learning rate on every rank's shard.
  void set_lr(double lr);
  double lr() const;

  // The owner (group rank) of parameters()[i].
  int owner(std::size_t i) const { return owner_.at(i); }
  // This rank's shard and its optimizer; null when this rank owns nothing.
  const std::vector<at::Tensor>& shard() const { return shard_; }
  torch::optim::Optimizer* shard_optimizer() { return local_.get(); }
  // Bytes of optimizer state held on this rank.
  std::int64_t local_state_bytes() const;

  // shard_gradients(true) only: while the guard lives, backward accumulates into
  // .grad locally (full size) and sends nothing; the next synchronised backward
  // sends the sum. Enter it before the forward. Throws ConfigError without
  // shard_gradients (use DDP's no_sync() there).
  class NoSync {
   public:
    explicit NoSync(GradientSharder& sharder);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    GradientSharder& sharder_;
  };
  [[nodiscard]] NoSync no_sync();
  // Collective: scales every gradient so that their total 2-norm over the whole
  // model is at most max_norm, as torch::nn::utils::clip_grad_norm_ over every
  // parameter would (coefficient max_norm / (norm + 1e-6), applied when below 1);
  // returns the total norm, the same on every rank. With shard_gradients(true) use
  // this, not clip_grad_norm_, which would see this rank's shard only.
  double clip_grad_norm(double max_norm);
  // Null unless shard_gradients(true).
  const GradientSharder* gradient_sharder() const { return sharder_.get(); }

 private:
  struct Probe;  // what the factory made of every parameter, before the base is built
  ShardedOptimizer(Probe probe, comm::Group group, OptimizerFactory make, ShardedOptimizerOptions options);
  struct Bucket {
    int owner = 0;
    std::vector<std::size_t> params;  // indices into parameters()
  };
  void broadcast_parameters();
  void check_trainable() const;  // Note [Unfreezing after construction]
  const std::vector<at::Tensor>& all_params() const;
  std::vector<at::Tensor> params_of(int rank) const;
  std::unique_ptr<torch::optim::Optimizer> whole_optimizer() const;

  // A handle: gather_state() is const for save()'s sake, yet runs collectives.
  mutable comm::Group group_;
  OptimizerFactory make_;
  ShardedOptimizerOptions options_;
  std::vector<int> owner_;
  std::vector<bool> trainable_;  // each parameter's requires_grad at construction
  std::vector<at::Tensor> shard_;
  std::unique_ptr<torch::optim::Optimizer> local_;
  std::vector<Bucket> buckets_;
  std::unique_ptr<GradientSharder> sharder_;  // ZeRO-2 (Note [ZeRO-2 gradients])
  // Filled by gather_state() on the rank gathered to (Note [Gathered for saving]).
  mutable std::unique_ptr<torch::optim::Optimizer> gathered_;
  mutable std::string gather_error_;  // why the gathering rank could not merge the shards
};

}  // namespace cohort::zero
