#include "cohort/tensor_parallel/embedding.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <ostream>
#include <utility>

#include "cohort/errors.h"
#include "cohort/tensor_parallel/collectives.h"
#include "cohort/tensor_parallel/linear.h"
#include "cohort/tensor_parallel/vocab_range.h"

namespace cohort::tensor_parallel {

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(comm::Group group, VocabParallelEmbeddingOptions options_)
    : options(std::move(options_)), group_(std::move(group)) {
  if (!group_.is_member())
    throw ConfigError("cohort VocabParallelEmbedding: this rank is not a member of the TP group it was given");
  if (options.num_embeddings() < 1 || options.num_embeddings() % group_.size() != 0)
    throw ConfigError(fmt::format("cohort VocabParallelEmbedding: num_embeddings is {}, which the {} ranks of TP "
                                  "group '{}' cannot split evenly; pad the vocabulary to a multiple of the TP size",
                                  options.num_embeddings(), group_.size(), group_.name()));
  // Note [Whole, then sliced] (linear.cpp).
  torch::nn::Embedding whole(options.num_embeddings(), options.embedding_dim());
  weight = register_parameter("weight", whole->weight.detach().slice(0, first_row(), last_row()).clone());
}

std::int64_t VocabParallelEmbeddingImpl::first_row() const {
  return group_.rank() * (options.num_embeddings() / group_.size());
}
std::int64_t VocabParallelEmbeddingImpl::last_row() const {
  return first_row() + options.num_embeddings() / group_.size();
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  if (ids.scalar_type() != at::kLong)
    throw ConfigError(fmt::format("cohort VocabParallelEmbedding: ids must be int64, got {}", std::string(ids.dtype().name())));
  // Note [Ids outside the vocabulary] (vocab_range.h): no rank holds them.
  detail::check_in_vocabulary(ids, options.num_embeddings(), std::nullopt, "VocabParallelEmbedding: token id",
                              group_);
  const auto first = first_row(), last = last_row();
  auto outside = (ids < first) | (ids >= last);
  auto local_ids = (ids - first).masked_fill(outside, 0);
  auto rows = at::embedding(weight, local_ids).masked_fill(outside.unsqueeze(-1), 0.0);
  return options.sequence_parallel() ? reduce_scatter_to_tp(rows, group_, kSequenceDim) : reduce_from_tp(rows, group_);
}

at::Tensor VocabParallelEmbeddingImpl::logits(const at::Tensor& hidden) {
  auto h = options.sequence_parallel() ? all_gather_from_tp(hidden, group_, kSequenceDim) : copy_to_tp(hidden, group_);
  return torch::matmul(h, weight.t());
}

void VocabParallelEmbeddingImpl::load_whole(const torch::nn::Embedding& whole) {
  const auto& w = whole->weight;
  if (w.size(0) != options.num_embeddings() || w.size(1) != options.embedding_dim())
    throw ConfigError(fmt::format("cohort VocabParallelEmbedding::load_whole: the table is {} x {}, but this one "
                                  "splits {} x {}",
                                  w.size(0), w.size(1), options.num_embeddings(), options.embedding_dim()));
  torch::NoGradGuard no_grad;
  weight.copy_(w.slice(0, first_row(), last_row()));
}

void VocabParallelEmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "cohort::tensor_parallel::VocabParallelEmbedding(num_embeddings=" << options.num_embeddings() << " ("
         << last_row() - first_row() << " on this rank of " << group_.size()
         << "), embedding_dim=" << options.embedding_dim() << ", sequence_parallel=" << std::boolalpha
         << options.sequence_parallel() << ")";
}

}  // namespace cohort::tensor_parallel
