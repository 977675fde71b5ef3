#include "cohort/tensor_parallel/attention.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <utility>

#include "cohort/errors.h"
#include "cohort/tensor_parallel/collectives.h"
#include "cohort/tensor_parallel/dropout.h"

namespace cohort::tensor_parallel {

ParallelSelfAttentionImpl::ParallelSelfAttentionImpl(comm::Group group, ParallelSelfAttentionOptions options_)
    : options(std::move(options_)), group_(std::move(group)) {
  const auto h = options.embed_dim(), n = options.num_heads();
  if (n < 1 || h % n != 0)
    throw ConfigError(fmt::format("cohort ParallelSelfAttention: embed_dim {} is not a multiple of num_heads {}", h, n));
  if (n % group_.size() != 0)
    throw ConfigError(fmt::format("cohort ParallelSelfAttention: num_heads is {}, which the {} ranks of TP group '{}' "
                                  "cannot split evenly; use a number of heads that is a multiple of the TP size",
                                  n, group_.size(), group_.name()));
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
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
  if (options.causal()) {
    auto future = torch::ones({s, s}, torch::dtype(torch::kBool).device(x.device())).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  }
  auto probs = sharded_dropout(torch::softmax(scores, -1), options.dropout(), is_training(), group_, 1);
  auto out = torch::matmul(probs, v).transpose(1, 2).reshape({q.size(0), s, local_heads * head_dim});
  return proj(out);
}

void ParallelSelfAttentionImpl::load_whole(const torch::nn::Linear& q, const torch::nn::Linear& k,
                                           const torch::nn::Linear& v, const torch::nn::Linear& p) {
  query->load_whole(q);
  key->load_whole(k);
  value->load_whole(v);
  proj->load_whole(p);
}

}  // namespace cohort::tensor_parallel
