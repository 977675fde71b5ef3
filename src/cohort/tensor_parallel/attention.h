#pragma once
// Causal self-attention split by heads over the TP group (Megatron-LM's): the query,
// key and value projections are column-parallel, so rank r computes heads
// [r n/T, (r+1) n/T) whole; the output projection is row-parallel and sums the
// heads' contributions. One all-reduce in forward, one in backward (with sequence
// parallelism: an all-gather before and a reduce-scatter after). Attention-probability
// dropout draws the one-process mask (dropout.h).
//
// Its one-process twin, for tests and for loading whole weights, is four
// torch::nn::Linear(H, H) named query, key, value and proj, in that order: a model
// built from the same seed holds the same numbers (Note [Whole, then sliced]).
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include "cohort/comm/group.h"
#include "cohort/tensor_parallel/linear.h"

namespace cohort::tensor_parallel {

struct ParallelSelfAttentionOptions {
  ParallelSelfAttentionOptions(std::int64_t embed_dim, std::int64_t num_heads)
      : embed_dim_(embed_dim), num_heads_(num_heads) {}
  TORCH_ARG(std::int64_t, embed_dim);
  // Split over the group: num_heads / T on each rank.
  TORCH_ARG(std::int64_t, num_heads);
  TORCH_ARG(double, dropout) = 0.0;  // on the attention probabilities
  TORCH_ARG(bool, causal) = true;
  TORCH_ARG(bool, sequence_parallel) = false;
};

class ParallelSelfAttentionImpl : public torch::nn::Module {
 public:
  ParallelSelfAttentionImpl(comm::Group group, ParallelSelfAttentionOptions options);
  // x: [batch, sequence, embed_dim] (its sequence shard with sequence_parallel).
  at::Tensor forward(const at::Tensor& x);
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
