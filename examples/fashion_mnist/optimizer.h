#pragma once
// The trainer's optimizer: Adam or SGD with momentum (cohort::optim's, by default
// with a fused or foreach step, --optimizer-kernel), whole on every rank, or
// sharded over the ranks with --zero 1, and with its gradients too with --zero 2
// (cohort::zero::ShardedOptimizer, docs/zero.md), or over the shards of a fully
// sharded model with --zero 3 (cohort::zero::FullyShardedOptimizer).
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "cohort/comm/world.h"
#include "options.h"
#include "strategy.h"

namespace fashion_mnist {

// Adam, or SGD with momentum 0.9 (`kind`), over `params`, stepping with `kernel`
// (cohort::optim::StepKernel's names): the optimizer one rank steps, or ZeRO's
// factory's.
std::unique_ptr<torch::optim::Optimizer> make_local_optimizer(const std::string& kind, const std::string& kernel,
                                                              double lr, std::vector<at::Tensor> params);

// Collective with --zero 1 or 2 (every rank builds it).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainerOptions& o, const Strategy& strategy,
                                                        cohort::comm::World& world);

// Collective: each rank's bytes of parameters, gradients and optimizer state, for
// the final JSON line ("memory_per_rank", rank 0's copy is the one printed).
nlohmann::json memory_per_rank(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                               cohort::comm::World& world, c10::Device device);

}  // namespace fashion_mnist
