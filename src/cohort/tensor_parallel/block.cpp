#include "cohort/tensor_parallel/block.h"

#include <torch/torch.h>

#include <unordered_set>
#include <utility>

#include "cohort/tensor_parallel/dropout.h"
#include "cohort/tensor_parallel/embedding.h"

namespace cohort::tensor_parallel {

ParallelTransformerBlockImpl::ParallelTransformerBlockImpl(comm::Group group, ParallelTransformerBlockOptions options_)
    : options(std::move(options_)), group_(std::move(group)) {
  const auto h = options.embed_dim(), hidden = options.mlp_ratio() * options.embed_dim();
  const bool sp = options.sequence_parallel();
  // Note [Whole, then sliced]: in the one-process twin's construction order.
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({h})));
  attention = register_module(
      "attention", ParallelSelfAttention(group_, ParallelSelfAttentionOptions(h, options.num_heads())
                                                     .dropout(options.dropout())
                                                     .kernel(options.attention_kernel())
                                                     .sequence_parallel(sp)));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({h})));
  fc1 = register_module("fc1", ColumnParallelLinear(group_, ColumnParallelLinearOptions(h, hidden).sequence_parallel(sp)));
  fc2 = register_module("fc2", RowParallelLinear(group_, RowParallelLinearOptions(hidden, h).sequence_parallel(sp)));
}

// The residual stream is replicated over the group, or sharded along the sequence:
// either way the mask is the one-process mask's (dropout.h).
at::Tensor ParallelTransformerBlockImpl::residual_dropout(const at::Tensor& branch) {
  if (options.sequence_parallel()) return sharded_dropout(branch, options.dropout(), is_training(), group_, kSequenceDim);
  return torch::dropout(branch, options.dropout(), is_training());
}

at::Tensor ParallelTransformerBlockImpl::forward(const at::Tensor& x) {
  auto h = x + residual_dropout(attention(ln1(x)));
  return h + residual_dropout(fc2(torch::gelu(fc1(ln2(h)))));
}

std::vector<at::Tensor> replicated_parameters(const torch::nn::Module& module) {
  std::unordered_set<const c10::TensorImpl*> sliced;
  for (const auto& m : module.modules(/*include_self=*/true)) {
    if (auto* col = dynamic_cast<const ColumnParallelLinearImpl*>(m.get())) {
      sliced.insert(col->weight.unsafeGetTensorImpl());
      if (col->bias.defined()) sliced.insert(col->bias.unsafeGetTensorImpl());
    } else if (auto* row = dynamic_cast<const RowParallelLinearImpl*>(m.get())) {
      sliced.insert(row->weight.unsafeGetTensorImpl());
    } else if (auto* emb = dynamic_cast<const VocabParallelEmbeddingImpl*>(m.get())) {
      sliced.insert(emb->weight.unsafeGetTensorImpl());
    }
  }
  std::vector<at::Tensor> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : module.parameters(/*recurse=*/true))
    if (!sliced.count(p.unsafeGetTensorImpl()) && seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

void sum_replicated_gradients(const torch::nn::Module& module, comm::Group& group) {
  if (group.size() == 1) return;
  std::vector<at::Tensor> grads;
  for (const auto& p : replicated_parameters(module))
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return;
  // One all-reduce for all of them: they are small (LayerNorms, biases).
  std::vector<at::Tensor> flat;
  for (const auto& g : grads) flat.push_back(g.reshape({-1}));
  auto bucket = torch::cat(flat);
  group.all_reduce(bucket);
  std::int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(bucket.slice(0, offset, offset + g.numel()).view_as(g));
    offset += g.numel();
  }
}

}  // namespace cohort::tensor_parallel
