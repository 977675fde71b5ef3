#pragma once
// Internal to tensor_parallel (embedding.cpp, cross_entropy.cpp): refuses token ids
// outside the vocabulary, as torch::nn::Embedding and cross_entropy do.
//
// Note [Ids outside the vocabulary]
// A vocabulary-parallel embedding looks up on each rank only the ids in its own
// rows and puts zeros for the others, and the cross-entropy takes each target's
// logit from the rank that holds it: an id outside [0, V) is held by no rank, so
// without a check it would read as a zero row, or a target logit of 0, and train
// on silently. On the CPU (or any device but CUDA) two reductions, min and max, and
// a ConfigError that names the id and the vocabulary. On CUDA a device-side assert
// (at::_assert_async: no host sync, so no stall per step); it names neither, as
// CUDA's own embedding assert does not, and the error surfaces at the next sync.
// The GPT trainer checks its token cache when it loads it, with the whole message.
#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>

#include "cohort/comm/group.h"
#include "cohort/errors.h"

namespace cohort::tensor_parallel::detail {

// ConfigError (CPU) or a device-side assert (CUDA) when an id is outside [0, vocab).
// `what` names the caller and the ids ("VocabParallelEmbedding: token id");
// `ignore`, when given, is a value let through (the cross-entropy's ignore_index).
// Inline: a new source file in src/CMakeLists.txt rebuilds the library's precompiled
// header, and with it every object of an existing build tree.
inline void check_in_vocabulary(const at::Tensor& ids, std::int64_t vocab, std::optional<std::int64_t> ignore,
                                const char* what, const comm::Group& group) {
  if (ids.numel() == 0) return;
  const auto counted = ignore ? ids.masked_fill(ids.eq(*ignore), 0) : ids;
  if (ids.is_cuda()) {
    at::_assert_async(counted.ge(0).logical_and(counted.lt(vocab)).all());
    return;
  }
  const auto low = counted.min().item<std::int64_t>(), high = counted.max().item<std::int64_t>();
  if (low >= 0 && high < vocab) return;
  throw ConfigError(std::string("cohort ") + what + " " + std::to_string(low < 0 ? low : high) +
                    " is outside the vocabulary [0, " + std::to_string(vocab) + ") (rank " +
                    std::to_string(group.rank()) + " of TP group '" + group.name() + "')" +
                    (ignore ? ", and not the ignore_index " + std::to_string(*ignore) : std::string()) +
                    "; such ids usually come from data tokenized with another tokenizer or vocabulary size (a stale "
                    "or corrupt token cache): rebuild the data with this model's tokenizer, or build the model "
                    "with its vocabulary size");
}

}  // namespace cohort::tensor_parallel::detail
