#include "optimizer.h"

#include <torch/optim.h>

#include "cohort/optim/adam.h"
#include "cohort/optim/sgd.h"
#include "cohort/zero/fully_sharded_optimizer.h"
#include "cohort/zero/sharded_optimizer.h"
#include "cohort/zero/state_bytes.h"

namespace fashion_mnist {

std::unique_ptr<torch::optim::Optimizer> make_local_optimizer(const std::string& kind, const std::string& kernel,
                                                              double lr, std::vector<at::Tensor> params) {
  const auto k = cohort::optim::parse_step_kernel(kernel);
  if (kind == "sgd") return std::make_unique<cohort::optim::SGD>(params, torch::optim::SGDOptions(lr).momentum(0.9), k);
  return std::make_unique<cohort::optim::Adam>(params, torch::optim::AdamOptions(lr), k);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainerOptions& o, const Strategy& strategy,
                                                        cohort::comm::World& world) {
  cohort::zero::OptimizerFactory make = [o](std::vector<torch::Tensor> params) {
    auto made = make_local_optimizer(o.optimizer, o.optimizer_kernel, o.lr, std::move(params));
    // --cuda-graphs: Note [A step inside a CUDA graph] (cohort/optim/capturable.h).
    if (o.cuda_graphs) {
      if (auto* adam = dynamic_cast<cohort::optim::Adam*>(made.get())) adam->capturable(true);
      if (auto* sgd = dynamic_cast<cohort::optim::SGD*>(made.get())) sgd->capturable(true);
    }
    return made;
  };
  if (const auto* sharded = strategy.fully_sharded())
    return std::make_unique<cohort::zero::FullyShardedOptimizer>(*sharded, make);
  auto& model = const_cast<Strategy&>(strategy).model();
  if (o.zero == 0) return make(model.parameters());
  return std::make_unique<cohort::zero::ShardedOptimizer>(
      model.parameters(), world.group(), make, cohort::zero::ShardedOptimizerOptions().shard_gradients(o.zero == 2));
}

nlohmann::json memory_per_rank(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                               cohort::comm::World& world, c10::Device device) {
  std::int64_t params = 0, grads = 0, state = 0;
  if (const auto* fully = dynamic_cast<const cohort::zero::FullyShardedOptimizer*>(&optimizer)) {
    params = fully->model().local_parameter_bytes();
    grads = fully->model().local_gradient_bytes();
    state = fully->local_state_bytes();
  } else {
    for (const auto& p : model.parameters()) {
      params += static_cast<std::int64_t>(p.nbytes());
      if (p.grad().defined()) grads += static_cast<std::int64_t>(p.grad().nbytes());
    }
    const auto* sharded = dynamic_cast<const cohort::zero::ShardedOptimizer*>(&optimizer);
    state = sharded ? sharded->local_state_bytes() : cohort::zero::optimizer_state_bytes(optimizer);
  }
  auto mine = torch::tensor({params, grads, state}, torch::dtype(torch::kInt64)).to(device);
  auto all = world.group().all_gather(mine);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& row : all) {
    auto r = row.cpu();
    out.push_back({{"parameter_bytes", r[0].item<std::int64_t>()},
                   {"gradient_bytes", r[1].item<std::int64_t>()},
                   {"optimizer_state_bytes", r[2].item<std::int64_t>()}});
  }
  return out;
}

}  // namespace fashion_mnist
