#pragma once
// A decoder-only transformer (GPT-2's shape, sized for CPU cores) split over a TP
// group: a vocabulary-parallel token embedding, a learned position embedding
// (replicated), `layers` pre-LayerNorm ParallelTransformerBlocks, a final LayerNorm,
// and the output layer tied to the token embedding. forward() returns this rank's
// slice of the vocabulary's logits; loss() is the vocabulary-parallel cross-entropy,
// so the whole logits are never gathered.
//
//   Gpt model(tp_group, GptOptions(vocab).layers(4));
//   auto loss = model->loss(model(ids), targets);   // ids, targets: [batch, context]
//
// With a TP group of one it is the one-process model, with the same parameters in
// the same order from the same seed (Note [Whole, then sliced] in linear.cpp): the
// reference the parity tests compare with. Parameter names (the Python peer loads
// them by name): embed.weight, position.weight, blocks.<i>.{ln1,attention.{query,
// key,value,proj},ln2,fc1,fc2}.{weight,bias}, norm.{weight,bias}.
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <vector>

#include "cohort/comm/group.h"
#include "cohort/tensor_parallel/block.h"
#include "cohort/tensor_parallel/embedding.h"
#include "cohort/zero/fully_shard.h"

namespace gpt {

struct GptOptions {
  explicit GptOptions(std::int64_t vocab_size) : vocab_size_(vocab_size) {}
  TORCH_ARG(std::int64_t, vocab_size);  // divisible by the TP size
  // The real vocabulary when vocab_size is padded for TP (0: vocab_size): only its
  // rows are drawn, the padding's start at zero (Note [The padding draws nothing]).
  TORCH_ARG(std::int64_t, unpadded_vocab_size) = 0;
  TORCH_ARG(std::int64_t, context) = 64;
  TORCH_ARG(std::int64_t, embed_dim) = 128;
  TORCH_ARG(std::int64_t, num_heads) = 4;  // divisible by the TP size
  TORCH_ARG(std::int64_t, layers) = 4;
  TORCH_ARG(double, dropout) = 0.1;
  // Activations between blocks sharded along the sequence (context divisible by T).
  TORCH_ARG(bool, sequence_parallel) = false;
};

class GptImpl : public torch::nn::Module {
 public:
  GptImpl(cohort::comm::Group tp_group, GptOptions options);

  // ids: [batch, S] int64 with S <= context (S divisible by T under sequence
  // parallelism). Returns this rank's logits slice, [batch, S, vocab / T].
  at::Tensor forward(const at::Tensor& ids);
  // The embeddings (token + position, then dropout): the residual stream entering
  // block 0, whole or, under sequence parallelism, this rank's sequence shard.
  at::Tensor embed_tokens(const at::Tensor& ids);
  // The final LayerNorm and the tied output layer on the residual stream.
  at::Tensor head(const at::Tensor& hidden);
  // Mean cross-entropy of the logits slice against targets [batch, S]: the same
  // value on every TP rank.
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets);

  // Model FLOPs of one training step on `tokens` tokens (forward + backward = 3 x
  // forward; matmuls only, as the usual 6 N + attention estimate), for the whole
  // model, whatever the TP size.
  double training_flops(std::int64_t tokens, std::int64_t sequence) const;
  // The whole model's parameter count (not this rank's slice).
  std::int64_t whole_parameter_count() const;

  const cohort::comm::Group& tp_group() const { return tp_; }

  // Recompute each block's activations in backward instead of keeping them
  // (cohort::recompute, --activation-checkpointing).
  void use_activation_checkpointing() { recompute_ = true; }
  // --zero 3: each block becomes a cohort::zero::FullyShard unit under the same name
  // (blocks.<i>), so its parameters are gathered only while it computes; the
  // embeddings and the final LayerNorm stay in the unit that wraps the whole model.
  void use_fully_shard_units();

  GptOptions options;
  cohort::tensor_parallel::VocabParallelEmbedding embed{nullptr};
  torch::nn::Embedding position{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm norm{nullptr};

 private:
  at::Tensor run_block(std::size_t i, const at::Tensor& x);

  cohort::comm::Group tp_;
  bool recompute_ = false;
  std::vector<cohort::zero::FullyShard<cohort::tensor_parallel::ParallelTransformerBlockImpl>> units_;
};
TORCH_MODULE(Gpt);

}  // namespace gpt
