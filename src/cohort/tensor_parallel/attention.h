#pragma once
// Causal self-attention split by heads over the TP group (Megatron-LM's): the query,
// key and value projections are column-parallel, so rank r computes heads
// [r n/T, (r+1) n/T) whole; the output projection is row-parallel and sums the
// heads' contributions. One all-reduce in forward, one in backward (with sequence
// parallelism: an all-gather before and a reduce-scatter after). Attention-probability
// dropout draws the one-process mask (dropout.h). Where LibTorch has it (2.0 and
// newer) and no dropout is drawn, the heads run ATen's scaled_dot_product_attention
// (flash attention on a GPU); otherwise scores, causal mask, softmax, dropout and the
// weighted sum explicitly (Note [Fused attention and sharded dropout] in attention.cpp).
//
// Its one-process twin, for tests and for loading whole weights, is four
// torch::nn::Linear(H, H) named query, key, value and proj, in that order: a model
// built from the same seed holds the same numbers (Note [Whole, then sliced]).
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>

#include "cohort/comm/group.h"
#include "cohort/tensor_parallel/linear.h"

namespace cohort::tensor_parallel {

// How the heads compute attention:
//   math       explicitly (scores, mask, softmax, sharded dropout, weighted sum), on
//              every LibTorch; the reference the others are tested against.
//   fused      ATen's scaled_dot_product_attention (compat/attention.h): LibTorch 2.0
//              or newer, and dropout 0 (it draws no dropout; refused otherwise).
//   automatic  fused where LibTorch has it and no dropout is drawn (dropout 0, or
//              eval()), else math.
enum class AttentionKernel { automatic, math, fused };

// "auto", "math", "fused".
std::string to_string(AttentionKernel kernel);

// The kernel forward() runs for `wanted` with this dropout, in training or eval mode.
AttentionKernel resolve_attention_kernel(AttentionKernel wanted, double dropout, bool training);

struct ParallelSelfAttentionOptions {
  ParallelSelfAttentionOptions(std::int64_t embed_dim, std::int64_t num_heads)
      : embed_dim_(embed_dim), num_heads_(num_heads) {}
  TORCH_ARG(std::int64_t, embed_dim);
  // Split over the group: num_heads / T on each rank.
  TORCH_ARG(std::int64_t, num_heads);
  TORCH_ARG(double, dropout) = 0.0;  // on the attention probabilities
  TORCH_ARG(bool, causal) = true;
  TORCH_ARG(bool, sequence_parallel) = false;
  // `math` forces the explicit attention (parity tests, or comparing kernels).
  TORCH_ARG(AttentionKernel, kernel) = AttentionKernel::automatic;
};

class ParallelSelfAttentionImpl : public torch::nn::Module {
 public:
  ParallelSelfAttentionImpl(comm::Group group, ParallelSelfAttentionOptions options);
  // x: [batch, sequence, embed_dim] (its sequence shard with sequence_parallel).
  at::Tensor forward(const at::Tensor& x);
  // The kernel forward() runs now (it depends on is_training()): math or fused.
  AttentionKernel kernel() const;
  // From the one-process twin's four layers.
  void load_whole(const torch::nn::Linear& query, const torch::nn::Linear& key, const torch::nn::Linear& value,
                  const torch::nn::Linear& proj);

  ParallelSelfAttentionOptions options;
  ColumnParallelLinear query{nullptr}, key{nullptr}, value{nullptr};
  RowParallelLinear proj{nullptr};

 private:
  comm::Group group_;
};
TORCH_MODULE(ParallelSelfAttention);

}  // namespace cohort::tensor_parallel
