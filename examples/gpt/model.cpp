#include "model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <mutex>
#include <string>
#include <utility>

#include "cohort/errors.h"
#include "cohort/recompute/checkpoint.h"
#include "cohort/tensor_parallel/cross_entropy.h"
#include "cohort/tensor_parallel/dropout.h"
#include "cohort/tensor_parallel/linear.h"

namespace gpt {

namespace tp = cohort::tensor_parallel;

GptImpl::GptImpl(cohort::comm::Group tp_group, GptOptions options_) : options(std::move(options_)), tp_(std::move(tp_group)) {
  const auto t = tp_.size();
  if (options.context() % t != 0 && options.sequence_parallel())
    throw cohort::ConfigError(fmt::format("gpt: sequence parallelism shards the context ({} tokens) over the {} TP "
                                          "ranks, which needs a multiple of {}; change --context or --tp",
                                          options.context(), t, t));
  const auto h = options.embed_dim();
  const bool sp = options.sequence_parallel();
  // Note [Whole, then sliced]: every table is drawn whole on every rank, so any TP
  // size starts from the one-process weights. GPT-2's N(0, 0.02) for both embeddings
  // (the default N(0, 1) would make the tied logits huge).
  // Note [The padding draws nothing]
  // The trainer pads the vocabulary to a multiple of the TP size, so an odd one is
  // 257 rows at TP 1 and 258 at TP 2. Were the padded table drawn, the draws of every
  // later parameter (and dropout's) would shift with the TP size. So the generator
  // advances as for the unpadded table: the embedding's own draw of the whole table
  // (overwritten below) is undone and redone at the real size, the real rows are
  // drawn, and the padding's rows are zeros. Unpadded, this draws what it always did.
  const auto v = options.vocab_size(), real = options.unpadded_vocab_size() > 0 ? options.unpadded_vocab_size() : v;
  if (real > v)
    throw cohort::ConfigError(fmt::format("gpt: the unpadded vocabulary ({}) is larger than the padded one ({})", real,
                                          v));
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    at::Tensor state;
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      state = generator.get_state();
    }
    embed = register_module("embed", tp::VocabParallelEmbedding(tp_, tp::VocabParallelEmbeddingOptions(v, h)
                                                                          .sequence_parallel(sp)));
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(state);
    }
    torch::nn::Embedding unpadded(real, h);  // the draw of the embedding's construction, at the real size
  }
  auto table = torch::zeros({v, h});
  table.slice(0, 0, real).copy_(torch::randn({real, h}) * 0.02);
  embed->load_whole(torch::nn::Embedding::from_pretrained(table));
  position = register_module("position", torch::nn::Embedding(options.context(), h));
  {
    torch::NoGradGuard no_grad;
    position->weight.normal_(0.0, 0.02);
  }
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < options.layers(); ++i)
    blocks->push_back(tp::ParallelTransformerBlock(
        tp_, tp::ParallelTransformerBlockOptions(h, options.num_heads()).dropout(options.dropout()).sequence_parallel(sp)));
  norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({h})));
}

at::Tensor GptImpl::embed_tokens(const at::Tensor& ids) {
  const auto s = ids.size(1);
  if (s > options.context())
    throw cohort::ConfigError(fmt::format("gpt: a sequence of {} tokens is longer than the model's context of {}; cut "
                                          "it, or build the model with GptOptions::context({})",
                                          s, options.context(), s));
  auto x = embed(ids);  // [B, S, H], or [B, S/T, H] under sequence parallelism
  auto pos = position->weight.slice(0, 0, s);
  if (options.sequence_parallel()) {
    const auto shard = s / tp_.size();
    pos = pos.slice(0, tp_.rank() * shard, (tp_.rank() + 1) * shard);
    return tp::sharded_dropout(x + pos, options.dropout(), is_training(), tp_, tp::kSequenceDim);
  }
  return torch::dropout(x + pos, options.dropout(), is_training());
}

at::Tensor GptImpl::head(const at::Tensor& hidden) { return embed->logits(norm(hidden)); }

void GptImpl::use_fully_shard_units() {
  units_.clear();
  for (std::size_t i = 0; i < blocks->size(); ++i) {
    cohort::zero::FullyShard<tp::ParallelTransformerBlockImpl> unit(blocks->ptr<tp::ParallelTransformerBlockImpl>(i));
    blocks->replace_module(std::to_string(i), unit.ptr());
    units_.push_back(unit);
  }
}

at::Tensor GptImpl::run_block(std::size_t i, const at::Tensor& x) {
  auto block = blocks->ptr<tp::ParallelTransformerBlockImpl>(i);
  if (!recompute_) return units_.empty() ? block->forward(x) : units_[i](x);
  // Captures what it needs by value: recomputation calls it again in backward. A
  // fully sharded unit's parameters exist only inside it, so under --zero 3 the
  // block is checkpointed without .modules() (docs/zero.md, Composing). The TP
  // collectives inside run again in backward, on every TP rank alike.
  auto unit = units_.empty() ? cohort::zero::FullyShard<tp::ParallelTransformerBlockImpl>(nullptr) : units_[i];
  auto segment = [block, unit](const cohort::recompute::TensorList& in) mutable {
    return cohort::recompute::TensorList{unit ? unit(in[0]) : block->forward(in[0])};
  };
  auto options = units_.empty() ? cohort::recompute::CheckpointOptions().modules({block})
                                : cohort::recompute::CheckpointOptions();
  return cohort::recompute::checkpoint(segment, {x}, options)[0];
}

at::Tensor GptImpl::forward(const at::Tensor& ids) {
  auto x = embed_tokens(ids);
  for (std::size_t i = 0; i < blocks->size(); ++i) x = run_block(i, x);
  return head(x);
}

at::Tensor GptImpl::loss(const at::Tensor& logits, const at::Tensor& targets) {
  return tp::vocab_parallel_cross_entropy(logits, targets, tp_);
}

std::int64_t GptImpl::whole_parameter_count() const {
  const auto h = options.embed_dim(), v = options.vocab_size(), hidden = 4 * h;
  const auto block = 2 * 2 * h + 4 * (h * h + h) + (h * hidden + hidden) + (hidden * h + h);
  return v * h + options.context() * h + options.layers() * block + 2 * h;
}

double GptImpl::training_flops(std::int64_t tokens, std::int64_t sequence) const {
  const double h = options.embed_dim(), v = options.vocab_size(), l = options.layers();
  // Per token, forward: 2 x (the matmuls' weights: 12 h^2 per layer, v h for the
  // logits) + attention's scores and weighted sum, 2 x 2 x s x h per layer.
  const double per_token = 2.0 * (12.0 * h * h * l + v * h) + 4.0 * sequence * h * l;
  return 3.0 * per_token * static_cast<double>(tokens);
}

}  // namespace gpt
