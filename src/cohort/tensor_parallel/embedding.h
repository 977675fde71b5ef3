#pragma once
// An embedding whose vocabulary is split over the TP group: rank r holds rows
// [r V/T, (r+1) V/T) of the V x H table. Each rank looks up the ids in its range, puts
// zeros for the others, and the ranks' results are summed (reduce_from_tp; with
// sequence_parallel, reduce-scattered along the sequence). Its table is the one a
// vocabulary-parallel output layer shares for tied embeddings
// (vocab_parallel_cross_entropy in cross_entropy.h).
//
// The table starts as torch::nn::Embedding's would from the same generator state,
// whole on every rank, which keeps its slice (Note [Whole, then sliced] in linear.cpp).
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include "cohort/comm/group.h"

namespace cohort::tensor_parallel {

struct VocabParallelEmbeddingOptions {
  VocabParallelEmbeddingOptions(std::int64_t num_embeddings, std::int64_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  // The whole vocabulary; each rank holds num_embeddings / T rows.
  TORCH_ARG(std::int64_t, num_embeddings);
  TORCH_ARG(std::int64_t, embedding_dim);
  // Reduce-scatter the output along the sequence ([batch, sequence, H]) instead of
  // all-reducing it.
  TORCH_ARG(bool, sequence_parallel) = false;
};

class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(comm::Group group, VocabParallelEmbeddingOptions options);
  // ids: any shape of int64 in [0, num_embeddings); returns ids.sizes() + [H].
  at::Tensor forward(const at::Tensor& ids);
  // The output layer of tied embeddings: hidden [.., H] (replicated, or its sequence
  // shard with sequence_parallel) times this rank's rows of the table, giving this
  // rank's slice of the vocabulary's logits for vocab_parallel_cross_entropy. It
  // starts with copy_to_tp (all_gather_from_tp under sequence parallelism): each
  // rank's slice contributes its part of the hidden state's gradient, which must be
  // summed; a plain matmul would leave each rank with its own part only.
  at::Tensor logits(const at::Tensor& hidden);
  void load_whole(const torch::nn::Embedding& whole);
  std::int64_t first_row() const;
  std::int64_t last_row() const;
  const comm::Group& group() const { return group_; }
  void pretty_print(std::ostream& stream) const override;

  VocabParallelEmbeddingOptions options;
  at::Tensor weight;  // [num_embeddings / T, embedding_dim]

 private:
  comm::Group group_;
};
TORCH_MODULE(VocabParallelEmbedding);

}  // namespace cohort::tensor_parallel
