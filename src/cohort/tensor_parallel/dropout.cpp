#include "cohort/tensor_parallel/dropout.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "cohort/errors.h"

namespace cohort::tensor_parallel {

// Note [Dropout as one process draws it]
// LibTorch's dropout on the CPU is input * bernoulli(1 - p) / (1 - p), its noise drawn
// over a tensor of the input's shape. A rank that draws that noise for the whole
// tensor, from the same generator state as the other ranks, and keeps its chunk, gets
// exactly the chunk of the one-process mask, and leaves its generator where the one
// process leaves it: the draws after it stay aligned too. The price is drawing the
// whole mask on every rank (T times the random numbers, not the memory of a whole
// activation kept for backward: only the chunk is kept). Megatron-LM instead draws
// sharded masks from a second, per-rank generator, which is cheaper but never equals
// one process. On CUDA, LibTorch fuses dropout into a kernel with its own draw
// order, so there the masks are valid dropout but not the one-process ones.
at::Tensor sharded_dropout(const at::Tensor& shard, double p, bool training, const comm::Group& group,
                           std::int64_t dim) {
  if (p < 0 || p > 1)
    throw ConfigError(fmt::format("cohort tensor_parallel::sharded_dropout: p is {}; it must be in [0, 1]", p));
  if (!training || p == 0) return shard;
  if (group.size() == 1) return at::dropout(shard, p, true);
  if (p == 1) return shard * 0;
  const auto d = dim < 0 ? dim + shard.dim() : dim;
  auto whole_sizes = shard.sizes().vec();
  whole_sizes.at(static_cast<std::size_t>(d)) *= group.size();
  auto noise = at::empty(whole_sizes, shard.options().requires_grad(false)).bernoulli_(1 - p);
  noise.div_(1 - p);
  return shard * noise.chunk(group.size(), d)[static_cast<std::size_t>(group.rank())];
}

}  // namespace cohort::tensor_parallel
