#pragma once
// What the ZeRO workers (zero_worker.cpp, fully_shard_worker.cpp) share: the
// optimizers they compare, and a module's parameters each once.
#include <torch/torch.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cohort/zero/sharded_optimizer.h"

namespace cohort::testing {

inline cohort::zero::OptimizerFactory zero_test_optimizer(const std::string& name) {
  if (name == "sgd")
    return [](std::vector<torch::Tensor> p) {
      return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
    };
  if (name == "adam")
    return [](std::vector<torch::Tensor> p) {
      return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2).weight_decay(1e-4));
    };
  if (name == "adamw")
    return [](std::vector<torch::Tensor> p) {
      return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2));
    };
  throw std::invalid_argument("unknown optimizer " + name);
}

// A parameter registered twice (a shared one) once, in order.
inline std::vector<torch::Tensor> unique_params(const torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) {
    bool seen = false;
    for (const auto& q : out) seen = seen || q.is_same(p);
    if (!seen) out.push_back(p);
  }
  return out;
}

}  // namespace cohort::testing
