#pragma once
// The training and validation batches: pure functions of the step, so that every
// rank, a resumed run and a Python peer (benchmarks/) compute the same windows.
//
// Note [The batch rule]
// B is the global batch (--batch-size), C the context, N the training stream's
// length in tokens, D the data-parallel replicas. For global step s (0 for the first
// step) and global sample j in [0, B):
//
//   offset(s, j) = ((s * B + j) * 1000003) mod (N - C - 1)
//   inputs  = train[offset : offset + C]
//   targets = train[offset + 1 : offset + C + 1]
//
// Replica d takes samples [d B / D, (d + 1) B / D), in order; the TP ranks (and the
// pipeline's stages) of one replica read the same ones. 1000003 is prime, so the
// windows walk the whole stream without a shuffle to reproduce. Validation is
// the first eval_batches x B non-overlapping windows of the validation stream,
// window w = val[w C : w C + C] and its targets one token later; in each validation
// batch replica d takes the same share as in training. In Python:
//
//   off = ((s * B + j) * 1000003) % (len(train) - C - 1)
//   x, y = train[off:off + C], train[off + 1:off + C + 1]
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace gpt {

struct Batch {
  at::Tensor inputs;   // [rows, context] int64
  at::Tensor targets;  // [rows, context] int64
};

// The window offset of global sample j at step s (Note [The batch rule]).
std::int64_t window_offset(std::int64_t step, std::int64_t sample, std::int64_t batch_size, std::int64_t tokens,
                           std::int64_t context);

// Replica `replica` of `replicas`' rows of the training batch of step `step`.
// ConfigError when the stream is shorter than a window.
Batch training_batch(const std::vector<std::int32_t>& train, std::int64_t step, std::int64_t batch_size,
                     std::int64_t context, int replica, int replicas);

// Replica `replica`'s rows of validation batch `index` (0-based). ConfigError when the
// validation stream holds fewer than (index + 1) x batch_size windows.
Batch validation_batch(const std::vector<std::int32_t>& validation, std::int64_t index, std::int64_t batch_size,
                       std::int64_t context, int replica, int replicas);

}  // namespace gpt
