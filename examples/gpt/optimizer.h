#pragma once
// AdamW (cohort::optim's: fused or over lists by default, --optimizer-kernel), whole on every rank, or sharded over the mesh's data group with --zero 1
// or 2 (cohort::zero::ShardedOptimizer), or over the shards of a fully sharded
// model with --zero 3 (cohort::zero::FullyShardedOptimizer); and its learning rate:
// a linear warmup, then a cosine decay to a tenth of the peak.
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>

#include "cohort/comm/device_mesh.h"
#include "options.h"
#include "strategy.h"

namespace gpt {

// Collective over the data group with --zero 1 or 2.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const GptTrainerOptions& o, Strategy& strategy,
                                                        cohort::comm::DeviceMesh& mesh);

// The learning rate of step s (0-based): lr (s + 1) / warmup during the warmup, then
// from lr down to lr / 10 along a half cosine at the last step.
double learning_rate(const GptTrainerOptions& o, std::int64_t step);

}  // namespace gpt
