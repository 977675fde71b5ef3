#pragma once
// Single-process references for the DDP thread-world tests: a small MLP, its
// gradients on a whole batch, and a comparison that says which parameter differs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <stdexcept>
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

// Makes backward throw when it reaches `t` ("skip this batch"), as a training
// loop's hook that rejects a batch would (Note [A step that failed]).
inline void throw_in_backward(torch::Tensor& t) {
  t.register_hook([](torch::Tensor) -> torch::Tensor { throw std::runtime_error("skip this batch"); });
}

// An MLP whose backward can be made to throw between its two layers: the second
// layer's buckets are then in flight, the first layer's are not.
struct MidFailImpl : torch::nn::Cloneable<MidFailImpl> {
  MidFailImpl() { reset(); }
  void reset() override {
    a = register_module("a", torch::nn::Linear(6, 8));
    b = register_module("b", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(const torch::Tensor& x, bool fail_between_layers) {
    auto h = torch::relu(a(x));
    if (fail_between_layers) throw_in_backward(h);
    return b(h);
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(MidFail);

}  // namespace cohort::testing
