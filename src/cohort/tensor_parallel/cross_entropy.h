#pragma once
// Cross-entropy over logits whose vocabulary is split over the TP group, without
// gathering them: rank r holds logits[..., r V/T : (r+1) V/T] (a column-parallel
// output layer's, or the tied embedding's: logits = h @ table_shard^T). Three
// all-reduces of one number per token (the maximum, the target's logit, the sum of
// exponentials) replace an all-gather of V/T numbers per token; backward needs none.
//
//   auto logits = embedding->logits(hidden);                       // [B, S, V/T], tied
//   auto loss = vocab_parallel_cross_entropy(logits, targets, tp); // targets [B, S]
//
// Returns the mean over the tokens whose target is not ignore_index, as
// torch::nn::functional::cross_entropy does with reduction mean; the same value on
// every rank, with every rank's logits getting its share of the gradient.
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "cohort/comm/group.h"

namespace cohort::tensor_parallel {

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, comm::Group group,
                                        std::int64_t ignore_index = -100);

}  // namespace cohort::tensor_parallel
