#pragma once
// One-process twins of the TP modules, in double precision, in the construction
// order their TP versions draw from (Note [Whole, then sliced]).
#include <torch/torch.h>

#include <cmath>
#include <cstdint>

#include "cohort/tensor_parallel/block.h"

namespace cohort::testing {

// Causal self-attention: query, key, value, proj; no dropout.
struct TwinAttention {
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, proj{nullptr};
  std::int64_t heads;
  TwinAttention(std::int64_t h, std::int64_t n) : heads(n) {
    q = torch::nn::Linear(h, h);
    k = torch::nn::Linear(h, h);
    v = torch::nn::Linear(h, h);
    proj = torch::nn::Linear(h, h);
    for (auto* l : {&q, &k, &v, &proj}) (*l)->to(torch::kDouble);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const std::int64_t b = x.size(0), s = x.size(1), h = x.size(2), hd = h / heads;
    auto split = [&](const torch::Tensor& t) { return t.view({b, s, heads, hd}).transpose(1, 2); };
    auto scores = torch::matmul(split(q(x)), split(k(x)).transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    scores = scores.masked_fill(torch::ones({s, s}, torch::kBool).triu(1), -INFINITY);
    return proj(torch::matmul(torch::softmax(scores, -1), split(v(x))).transpose(1, 2).reshape({b, s, h}));
  }
};

// Pre-LayerNorm block: ln1, attention, ln2, fc1, fc2; no dropout.
struct TwinBlock {
  torch::nn::LayerNorm ln1{nullptr};
  TwinAttention attention;
  torch::nn::LayerNorm ln2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  TwinBlock(std::int64_t h, std::int64_t n)
      : ln1(torch::nn::LayerNormOptions({h})), attention(h, n), ln2(torch::nn::LayerNormOptions({h})) {
    fc1 = torch::nn::Linear(h, 4 * h);
    fc2 = torch::nn::Linear(4 * h, h);
    ln1->to(torch::kDouble);
    ln2->to(torch::kDouble);
    fc1->to(torch::kDouble);
    fc2->to(torch::kDouble);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = x + attention.forward(ln1(x));
    return h + fc2(torch::gelu(fc1(ln2(h))));
  }
};

// The block's slices of its twin's whole weights.
inline void load_twin(cohort::tensor_parallel::ParallelTransformerBlock& block, TwinBlock& twin) {
  torch::NoGradGuard no_grad;
  block->ln1->weight.copy_(twin.ln1->weight);
  block->ln1->bias.copy_(twin.ln1->bias);
  block->ln2->weight.copy_(twin.ln2->weight);
  block->ln2->bias.copy_(twin.ln2->bias);
  block->attention->load_whole(twin.attention.q, twin.attention.k, twin.attention.v, twin.attention.proj);
  block->fc1->load_whole(twin.fc1);
  block->fc2->load_whole(twin.fc2);
}

}  // namespace cohort::testing
