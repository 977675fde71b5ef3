#pragma once
// Single-process references for the DDP thread-world tests: a small MLP, its
// gradients on a whole batch, and a comparison that says which parameter differs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace cohort::testing {

inline torch::nn::Sequential small_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
}

// The gradients of `model` on `x` against target 0, as a single process computes them.
inline std::vector<torch::Tensor> mlp_grads(torch::nn::Sequential model, const torch::Tensor& x) {
  model->zero_grad();
  model->forward(x).pow(2).mean().backward();
  std::vector<torch::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.grad().clone());
  return out;
}

// The largest |got - expected| over every parameter's gradient; an undefined
// gradient counts as zeros.
inline double max_grad_error(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& expected) {
  EXPECT_EQ(params.size(), expected.size());
  double worst = 0;
  for (std::size_t i = 0; i < params.size() && i < expected.size(); ++i) {
    auto g = params[i].grad().defined() ? params[i].grad() : torch::zeros_like(params[i]);
    worst = std::max(worst, (g - expected[i]).abs().max().item<double>());
  }
  return worst;
}

}  // namespace cohort::testing
