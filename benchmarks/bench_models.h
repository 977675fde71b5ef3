#pragma once
// The models of the DDP benchmark (ddp_bench.cpp). ddp_peer.py builds the same
// architectures in PyTorch, with parameters in the same registration order, so both
// sides plan the same buckets. Change one side, change the other.
//
//   mlp   784-256-256-10, batch 64: a few large tensors
//   cnn   conv 1->16, pool, conv 16->32, pool, linear -> 10 on 28x28, batch 32
//   deep  24 x (Linear 256x256, LayerNorm, ReLU), linear -> 10, batch 16: 98 tensors,
//         6.1 MiB of gradients, 1 MiB buckets (6 of them, on both sides)
//   wide  6 x (Linear 2048x2048, ReLU), linear -> 10, batch 512: 96 MiB of gradients
//         in 25 MiB buckets, enough to keep a GPU busy (scripts/gpu-check); not in
//         "all", which stays the CPU's three
#include <torch/torch.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace cohort::bench {

struct ModelSpec {
  std::string name;
  std::vector<std::int64_t> input;  // one sample's shape
  std::int64_t batch;
  int steps;  // per repetition, so that one repetition takes a few tenths of a second
  std::int64_t bucket_cap_mb;
};

inline const std::vector<ModelSpec>& model_specs() {
  static const std::vector<ModelSpec> specs = {
      {"mlp", {784}, 64, 30, 25},
      {"cnn", {1, 28, 28}, 32, 60, 25},
      {"deep", {256}, 16, 15, 1},
  };
  return specs;
}

inline const ModelSpec& model_spec(const std::string& name) {
  static const ModelSpec wide{"wide", {2048}, 512, 20, 25};
  if (name == wide.name) return wide;
  for (const auto& spec : model_specs())
    if (spec.name == name) return spec;
  throw std::invalid_argument("unknown model '" + name + "' (mlp, cnn, deep or wide)");
}

constexpr std::int64_t kClasses = 10;
constexpr int kDeepBlocks = 24;
constexpr std::int64_t kDeepWidth = 256;
constexpr int kWideLayers = 6;
constexpr std::int64_t kWideWidth = 2048;

inline torch::nn::Sequential make_model(const std::string& name) {
  namespace nn = torch::nn;
  if (name == "mlp")
    return nn::Sequential(nn::Linear(784, 256), nn::ReLU(), nn::Linear(256, 256), nn::ReLU(),
                          nn::Linear(256, kClasses));
  if (name == "cnn")
    return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 16, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                          nn::Conv2d(nn::Conv2dOptions(16, 32, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                          nn::Flatten(), nn::Linear(32 * 7 * 7, kClasses));
  if (name == "deep") {
    nn::Sequential model;
    for (int i = 0; i < kDeepBlocks; ++i) {
      model->push_back(nn::Linear(kDeepWidth, kDeepWidth));
      model->push_back(nn::LayerNorm(nn::LayerNormOptions({kDeepWidth})));
      model->push_back(nn::ReLU());
    }
    model->push_back(nn::Linear(kDeepWidth, kClasses));
    return model;
  }
  if (name == "wide") {
    nn::Sequential model;
    for (int i = 0; i < kWideLayers; ++i) {
      model->push_back(nn::Linear(kWideWidth, kWideWidth));
      model->push_back(nn::ReLU());
    }
    model->push_back(nn::Linear(kWideWidth, kClasses));
    return model;
  }
  throw std::invalid_argument("unknown model '" + name + "' (mlp, cnn, deep or wide)");
}

// One synthetic batch, made once per rank (seeded by rank) and reused every step.
struct Batch {
  torch::Tensor input;
  torch::Tensor target;
};

inline Batch make_batch(const ModelSpec& spec, int rank) {
  torch::manual_seed(1000 + rank);
  std::vector<std::int64_t> shape{spec.batch};
  shape.insert(shape.end(), spec.input.begin(), spec.input.end());
  return {torch::randn(shape), torch::randint(kClasses, {spec.batch})};
}

inline double gradient_mb(const torch::nn::Module& model) {
  std::int64_t bytes = 0;
  for (const auto& p : model.parameters()) bytes += p.numel() * static_cast<std::int64_t>(p.element_size());
  return static_cast<double>(bytes) / (1 << 20);
}

}  // namespace cohort::bench
