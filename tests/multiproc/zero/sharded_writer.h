#pragma once
// The model and the marks of the kill -9 test of sharded saves (zero_test.cpp,
// zero_worker's `writer`): step s holds every weight and every Adam moment equal to
// s, so a checkpoint that mixed two saves, or lost a shard, loads visibly wrong.
#include <torch/torch.h>

#include "cohort/zero/sharded_optimizer.h"

namespace cohort::testing {

// About 1 MB of weights and 2 MB of Adam's moments: a save takes long enough for a
// kill to land inside it.
inline torch::nn::Sequential sharded_writer_model() {
  return torch::nn::Sequential(torch::nn::Linear(256, 256), torch::nn::Linear(256, 256), torch::nn::Linear(256, 256),
                               torch::nn::Linear(256, 256));
}

inline zero::OptimizerFactory sharded_writer_adam() {
  return [](std::vector<torch::Tensor> p) { return std::make_unique<torch::optim::Adam>(p, 1e-3); };
}

// Sets every weight, and every moment of this rank's shard, to `value`.
inline void mark(torch::nn::Module& model, zero::ShardedOptimizer& optimizer, double value) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) p.fill_(value);
  if (auto* local = optimizer.shard_optimizer())
    for (auto& entry : local->state()) {
      auto& s = static_cast<torch::optim::AdamParamState&>(*entry.second);
      s.exp_avg().fill_(value);
      s.exp_avg_sq().fill_(value);
    }
}

// Whether every weight and every moment of this rank's shard is `value`, and every
// parameter of the shard has its moments.
inline bool marked(const torch::nn::Module& model, zero::ShardedOptimizer& optimizer, double value) {
  for (const auto& p : model.parameters())
    if (!p.eq(value).all().item<bool>()) return false;
  auto* local = optimizer.shard_optimizer();
  const std::size_t want = optimizer.shard().size();
  if (want == 0) return local == nullptr || local->state().empty();
  if (local == nullptr || local->state().size() != want) return false;
  for (const auto& entry : local->state()) {
    const auto& s = static_cast<const torch::optim::AdamParamState&>(*entry.second);
    if (!s.exp_avg().eq(value).all().item<bool>() || !s.exp_avg_sq().eq(value).all().item<bool>()) return false;
  }
  return true;
}

}  // namespace cohort::testing
