#pragma once
// The models of the DDP parity tests. Each is built from a seed, so every rank and
// the single-process reference start from identical weights.
#include <torch/torch.h>

namespace cohort::testing {

inline torch::nn::Sequential make_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(20, 32), torch::nn::ReLU(), torch::nn::Linear(32, 32),
                               torch::nn::Tanh(), torch::nn::Linear(32, 4));
}

// A projection whose weight is handed in, so two of them can share one tensor.
struct ProjectionImpl : torch::nn::Module {
  explicit ProjectionImpl(torch::Tensor weight) { weight_ = register_parameter("weight", weight); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::matmul(x, weight_); }
  torch::Tensor weight_;
};
TORCH_MODULE(Projection);

// "encode" and "decode" share one weight: named_parameters() lists it twice.
struct SharedNetImpl : torch::nn::Module {
  SharedNetImpl() {
    embed = register_module("embed", torch::nn::Linear(20, 16));
    auto w = torch::randn({16, 16}) * 0.25;
    encode = register_module("encode", Projection(w));
    decode = register_module("decode", Projection(w));
    inner = register_module("inner", torch::nn::Linear(16, 16));
    head = register_module("head", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return head(decode(torch::tanh(inner(encode(embed(x))))));
  }
  Projection encode{nullptr}, decode{nullptr};
  torch::nn::Linear embed{nullptr}, inner{nullptr}, head{nullptr};
};
TORCH_MODULE(SharedNet);

// `never` is never used; `odd_steps` only when forward is told so (the same on every
// rank), so the set of unused parameters changes from step to step.
struct PartlyUsedNetImpl : torch::nn::Module {
  PartlyUsedNetImpl() {
    body = register_module("body", torch::nn::Linear(20, 16));
    never = register_module("never", torch::nn::Linear(16, 16));
    odd_steps = register_module("odd_steps", torch::nn::Linear(16, 16));
    head = register_module("head", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_odd) {
    auto h = torch::relu(body(x));
    if (use_odd) h = h + odd_steps(h);
    return head(h);
  }
  torch::nn::Linear body{nullptr}, never{nullptr}, odd_steps{nullptr}, head{nullptr};
};
TORCH_MODULE(PartlyUsedNet);

}  // namespace cohort::testing
