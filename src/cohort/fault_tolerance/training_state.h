#pragma once
// The usual training state as one stream, for ReplicaGroup::on_transfer: the
// module's parameters and buffers, the optimizer's state (Adam's moments, step
// counts) and the default random generators.
//
//   replicas.on_transfer(
//       [&](std::ostream& out) { save_training_state(out, *model, &optimizer); },
//       [&](std::istream& in) { load_training_state(in, *model, &optimizer); });
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <iosfwd>

namespace cohort::fault_tolerance {

class ReplicaShardedOptimizer;

// `optimizer` may be null (a model trained without state, or one you send yourself).
void save_training_state(std::ostream& out, const torch::nn::Module& module, const torch::optim::Optimizer* optimizer);
// Loads into a module of the same structure, on its current device. Throws
// DataError when the stream is not what save_training_state wrote for this model.
void load_training_state(std::istream& in, torch::nn::Module& module, torch::optim::Optimizer* optimizer);

// With ZeRO inside each replica (replica_sharded_optimizer.h): the model and this
// rank's shard of the optimizer state, which only a rank of the same shard can load.
void save_training_state(std::ostream& out, const torch::nn::Module& module, const ReplicaShardedOptimizer& optimizer);
void load_training_state(std::istream& in, torch::nn::Module& module, ReplicaShardedOptimizer& optimizer);

}  // namespace cohort::fault_tolerance
