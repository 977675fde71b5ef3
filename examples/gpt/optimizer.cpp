#include "optimizer.h"


#include <algorithm>
#include <cmath>

#include "cohort/optim/adam.h"
#include "cohort/zero/fully_sharded_optimizer.h"
#include "cohort/zero/sharded_optimizer.h"

namespace gpt {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const GptTrainerOptions& o, Strategy& strategy,
                                                        cohort::comm::DeviceMesh& mesh) {
  cohort::zero::OptimizerFactory make = [o](std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<cohort::optim::AdamW>(
        params, torch::optim::AdamWOptions(o.lr).betas({0.9, 0.95}).weight_decay(o.weight_decay),
        cohort::optim::parse_step_kernel(o.optimizer_kernel));
  };
  if (const auto* sharded = strategy.fully_sharded())
    return std::make_unique<cohort::zero::FullyShardedOptimizer>(*sharded, make);
  if (o.zero == 0) return make(strategy.model().parameters());
  return std::make_unique<cohort::zero::ShardedOptimizer>(
      strategy.model().parameters(), mesh.group(cohort::comm::MeshDim::kData), make,
      cohort::zero::ShardedOptimizerOptions().shard_gradients(o.zero == 2));
}

double learning_rate(const GptTrainerOptions& o, std::int64_t step) {
  if (step < o.warmup_steps) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  const auto decay = std::max<std::int64_t>(1, o.steps - 1 - o.warmup_steps);
  const double done = std::clamp(static_cast<double>(step - o.warmup_steps) / static_cast<double>(decay), 0.0, 1.0);
  const double floor = o.lr / 10;
  return floor + (o.lr - floor) * 0.5 * (1.0 + std::cos(M_PI * done));
}

}  // namespace gpt
