#include "cohort/tensor_parallel/cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>

#include "cohort/errors.h"
#include "cohort/tensor_parallel/vocab_range.h"

namespace cohort::tensor_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Note [Cross-entropy over a split vocabulary]
// For one token with logits z over the whole vocabulary and target t:
//   loss = log(sum_v exp(z_v - m)) - (z_t - m),   m = max_v z_v,
//   dloss/dz_v = softmax(z)_v - [v == t].
// m, z_t - m and the sum each combine the ranks' local parts with one all-reduce
// (max, sum, sum): z_t lives on one rank, the others add 0. m is a constant of the
// differentiation (any m gives the same loss), so backward is local: each rank's
// softmax slice, exp(z - m) / sum, less 1 at the target if it holds it. Computing in
// float32 at least keeps bf16 logits from losing the sum.
class VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            comm::Group group, std::int64_t ignore_index) {
    const auto vocab_shard = logits.size(-1);
    const auto first = group.rank() * vocab_shard;
    auto z = logits.to(at::promote_types(logits.scalar_type(), at::kFloat)).reshape({-1, vocab_shard});
    auto t = targets.reshape({-1});
    auto ignored = t.eq(ignore_index);

    auto m = std::get<0>(z.max(-1)).contiguous();
    group.all_reduce(m, comm::ReduceOp::kMax);
    auto shifted = z - m.unsqueeze(-1);

    auto local_t = t - first;
    auto mine = (local_t >= 0) & (local_t < vocab_shard) & ignored.logical_not();
    auto index = local_t.masked_fill(mine.logical_not(), 0).unsqueeze(-1);
    auto target_logit = shifted.gather(-1, index).squeeze(-1).masked_fill(mine.logical_not(), 0.0).contiguous();
    group.all_reduce(target_logit, comm::ReduceOp::kSum);

    auto exp = shifted.exp();
    auto sum = exp.sum(-1).contiguous();
    group.all_reduce(sum, comm::ReduceOp::kSum);

    auto per_token = (sum.log() - target_logit).masked_fill(ignored, 0.0);
    const auto counted = (t.numel() - ignored.sum()).clamp_min(1).to(per_token.scalar_type());
    auto loss = per_token.sum() / counted;

    ctx->save_for_backward({exp.div_(sum.unsqueeze(-1)), index, mine, ignored, counted});
    ctx->saved_data["dtype"] = static_cast<std::int64_t>(logits.scalar_type());
    ctx->saved_data["shape"] = logits.sizes().vec();
    return loss.to(logits.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto softmax = saved[0], index = saved[1], mine = saved[2], ignored = saved[3], counted = saved[4];
    // d(mean)/d(logits): (softmax - one_hot(target)) / counted, zero for ignored tokens.
    auto grad = softmax.scatter_add(-1, index, mine.unsqueeze(-1).to(softmax.scalar_type()).neg());
    grad.masked_fill_(ignored.unsqueeze(-1), 0.0);
    grad.mul_(grads[0].to(grad.scalar_type()) / counted);
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.reshape(ctx->saved_data["shape"].toIntVector()).to(dtype), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, comm::Group group,
                                        std::int64_t ignore_index) {
  if (!group.is_member())
    throw ConfigError("cohort vocab_parallel_cross_entropy: this rank is not a member of the TP group it was given");
  if (logits.dim() < 1 || targets.sizes() != logits.sizes().slice(0, logits.dim() - 1))
    throw ConfigError(fmt::format("cohort vocab_parallel_cross_entropy: targets of shape [{}] do not match logits of "
                                  "shape [{}] (rank {} of TP group '{}'); targets must be the logits' shape without "
                                  "its last, vocabulary, dimension",
                                  fmt::join(targets.sizes(), ", "), fmt::join(logits.sizes(), ", "), group.rank(),
                                  group.name()));
  if (targets.scalar_type() != at::kLong)
    throw ConfigError(fmt::format("cohort vocab_parallel_cross_entropy: targets must be int64, got {}",
                                  std::string(targets.dtype().name())));
  // Note [Ids outside the vocabulary] (vocab_range.h): such a target's logit is no rank's.
  detail::check_in_vocabulary(targets, logits.size(-1) * group.size(), ignore_index,
                              "vocab_parallel_cross_entropy: target", group);
  return VocabParallelCrossEntropy::apply(logits, targets, std::move(group), ignore_index);
}

}  // namespace cohort::tensor_parallel
