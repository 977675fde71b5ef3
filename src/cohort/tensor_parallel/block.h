#pragma once
// A pre-LayerNorm transformer block split over the TP group:
//
//   h = x + dropout(attention(ln1(x)))       attention split by heads
//   y = h + dropout(fc2(gelu(fc1(ln2(h)))))  fc1 column-, fc2 row-parallel
//
// Two all-reduces in forward and two in backward (with sequence parallelism, an
// all-gather before each half and a reduce-scatter after it, the residual stream and
// the LayerNorms working on the sequence shard). Its one-process twin is, in
// construction order: ln1, attention's query, key, value, proj, ln2, fc1, fc2.
#include <torch/nn/module.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <vector>

#include "cohort/comm/group.h"
#include "cohort/tensor_parallel/attention.h"
#include "cohort/tensor_parallel/linear.h"

namespace cohort::tensor_parallel {

struct ParallelTransformerBlockOptions {
  ParallelTransformerBlockOptions(std::int64_t embed_dim, std::int64_t num_heads)
      : embed_dim_(embed_dim), num_heads_(num_heads) {}
  TORCH_ARG(std::int64_t, embed_dim);
  TORCH_ARG(std::int64_t, num_heads);
  TORCH_ARG(std::int64_t, mlp_ratio) = 4;
  TORCH_ARG(double, dropout) = 0.0;  // attention probabilities and both residual branches
  TORCH_ARG(bool, sequence_parallel) = false;
  TORCH_ARG(AttentionKernel, attention_kernel) = AttentionKernel::automatic;  // attention.h
};

class ParallelTransformerBlockImpl : public torch::nn::Module {
 public:
  ParallelTransformerBlockImpl(comm::Group group, ParallelTransformerBlockOptions options);
  // x: [batch, sequence, embed_dim], or its sequence shard with sequence_parallel.
  at::Tensor forward(const at::Tensor& x);

  ParallelTransformerBlockOptions options;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  ParallelSelfAttention attention{nullptr};
  ColumnParallelLinear fc1{nullptr};
  RowParallelLinear fc2{nullptr};

 private:
  at::Tensor residual_dropout(const at::Tensor& branch);
  comm::Group group_;
};
TORCH_MODULE(ParallelTransformerBlock);

// The parameters of `module` that every rank of its TP group holds whole (LayerNorms,
// row-parallel biases, anything outside the TP layers), as opposed to the TP layers'
// slices. Under sequence parallelism each rank's gradient of these covers only its
// sequence shard: sum them over the group after backward, before the optimizer
// (sum_replicated_gradients). Without it their gradients are already whole.
std::vector<at::Tensor> replicated_parameters(const torch::nn::Module& module);
void sum_replicated_gradients(const torch::nn::Module& module, comm::Group& group);

}  // namespace cohort::tensor_parallel
