#include "cohort/tensor_parallel/attention.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <utility>

#include "cohort/compat/attention.h"
#include "cohort/errors.h"
#include "cohort/tensor_parallel/collectives.h"
#include "cohort/tensor_parallel/dropout.h"

namespace cohort::tensor_parallel {

// Note [Fused attention and sharded dropout]
// scaled_dot_product_attention can drop attention probabilities itself, but it draws
// its mask inside the kernel, from this rank's generator, for this rank's heads only.
// That mask is not the one-process model's (Note [Dropout as one process draws it] in
// dropout.cpp): a TP run would no longer equal one process, it would change with the
// TP size, and ranks seeded alike would drop the same positions in their i-th heads.
// So the fused kernel runs only where no dropout is drawn: dropout 0, or eval(). A
// training run with dropout takes the explicit path and sharded_dropout, paying its
// [sequence, sequence] scores per head. GPT-2-size pretraining drops nothing (the
// GPT example's --dropout defaults to 0), so it gets flash attention on a GPU.
// The two paths agree within float rounding, not bit for bit (the fused kernels sum
// in another order and normalise the softmax online); attention_kernel_test checks
// outputs and gradients against each other and against the one-process twin.

std::string to_string(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::automatic: return "auto";
    case AttentionKernel::math: return "math";
    case AttentionKernel::fused: return "fused";
  }
  return "?";
}

AttentionKernel resolve_attention_kernel(AttentionKernel wanted, double dropout, bool training) {
  if (wanted == AttentionKernel::fused && !compat::kHasScaledDotProductAttention)
    throw ConfigError(std::string("cohort ParallelSelfAttention: kernel(AttentionKernel::fused) needs "
                                  "scaled_dot_product_attention, which LibTorch ") +
                      TORCH_VERSION + " lacks (2.0 or newer has it); use AttentionKernel::automatic or math");
  if (wanted == AttentionKernel::fused && dropout > 0.0)
    throw ConfigError(fmt::format("cohort ParallelSelfAttention: kernel(AttentionKernel::fused) with dropout {}: the "
                                  "fused kernel's dropout would not draw the one-process mask (Note [Fused attention "
                                  "and sharded dropout]); use AttentionKernel::automatic, which runs the fused kernel "
                                  "whenever no dropout is drawn, or dropout 0",
                                  dropout));
  if (wanted != AttentionKernel::automatic) return wanted;
  const bool draws = training && dropout > 0.0;
  return compat::kHasScaledDotProductAttention && !draws ? AttentionKernel::fused : AttentionKernel::math;
}

ParallelSelfAttentionImpl::ParallelSelfAttentionImpl(comm::Group group, ParallelSelfAttentionOptions options_)
    : options(std::move(options_)), group_(std::move(group)) {
  const auto h = options.embed_dim(), n = options.num_heads();
  if (n < 1 || h % n != 0)
    throw ConfigError(fmt::format("cohort ParallelSelfAttention: embed_dim {} is not a multiple of num_heads {}", h, n));
  if (n % group_.size() != 0)
    throw ConfigError(fmt::format("cohort ParallelSelfAttention: num_heads is {}, which the {} ranks of TP group '{}' "
                                  "cannot split evenly; use a number of heads that is a multiple of the TP size",
                                  n, group_.size(), group_.name()));
  resolve_attention_kernel(options.kernel(), options.dropout(), /*training=*/true);  // refuses early
  const bool sp = options.sequence_parallel();
  // Note [Whole, then sliced]: built in the one-process twin's order. forward()
  // gathers the input once for the three projections (input_is_gathered).
  const auto column = ColumnParallelLinearOptions(h, h).sequence_parallel(sp).input_is_gathered(true);
  query = register_module("query", ColumnParallelLinear(group_, column));
  key = register_module("key", ColumnParallelLinear(group_, column));
  value = register_module("value", ColumnParallelLinear(group_, column));
  proj = register_module("proj", RowParallelLinear(group_, RowParallelLinearOptions(h, h).sequence_parallel(sp)));
}

at::Tensor ParallelSelfAttentionImpl::forward(const at::Tensor& x) {
  if (x.dim() != 3 || x.size(2) != options.embed_dim())
    throw ConfigError(fmt::format("cohort ParallelSelfAttention: expected [batch, sequence, {}], got a tensor of {} "
                                  "dimensions with last size {}",
                                  options.embed_dim(), x.dim(), x.size(-1)));
  const auto local_heads = options.num_heads() / group_.size();
  const auto head_dim = options.embed_dim() / options.num_heads();
  // [B, S, local_heads * head_dim] -> [B, local_heads, S, head_dim]
  auto heads = [&](const at::Tensor& t) { return t.view({t.size(0), t.size(1), local_heads, head_dim}).transpose(1, 2); };
  // One collective for the three projections in each direction: the whole input
  // (all-gathered from the sequence shards under sequence parallelism), and in
  // backward the sum of the three layers' gradients, all-reduced (reduce-scattered)
  // once.
  const auto whole = options.sequence_parallel() ? all_gather_from_tp(x, group_, kSequenceDim) : copy_to_tp(x, group_);
  auto q = heads(query(whole)), k = heads(key(whole)), v = heads(value(whole));
  const auto s = q.size(2);
  at::Tensor mixed;  // [B, local_heads, S, head_dim]
  if (kernel() == AttentionKernel::fused) {
    mixed = compat::scaled_dot_product_attention(q, k, v, options.causal());
  } else {
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
    if (options.causal()) {
      auto future = torch::ones({s, s}, torch::dtype(torch::kBool).device(x.device())).triu(1);
      scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
    }
    auto probs = sharded_dropout(torch::softmax(scores, -1), options.dropout(), is_training(), group_, 1);
    mixed = torch::matmul(probs, v);
  }
  return proj(mixed.transpose(1, 2).reshape({q.size(0), s, local_heads * head_dim}));
}

AttentionKernel ParallelSelfAttentionImpl::kernel() const {
  return resolve_attention_kernel(options.kernel(), options.dropout(), is_training());
}

void ParallelSelfAttentionImpl::load_whole(const torch::nn::Linear& q, const torch::nn::Linear& k,
                                           const torch::nn::Linear& v, const torch::nn::Linear& p) {
  query->load_whole(q);
  key->load_whole(k);
  value->load_whole(v);
  proj->load_whole(p);
}

}  // namespace cohort::tensor_parallel
