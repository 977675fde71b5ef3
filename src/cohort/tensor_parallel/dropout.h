#pragma once
// Dropout that draws what one process would (Note [Dropout as one process draws it]):
// on an activation sharded over the TP group along `dim` (attention heads, the
// sequence under sequence parallelism), each rank draws the whole mask and keeps its
// chunk; on a replicated activation, plain dropout, which every rank draws alike
// from its identically seeded generator. Either way the masks are the one-process
// model's, so a TP run with dropout equals one process, bit for bit on the CPU.
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "cohort/comm/group.h"

namespace cohort::tensor_parallel {

// `shard` is this rank's chunk along `dim` of a tensor group.size() times as large.
at::Tensor sharded_dropout(const at::Tensor& shard, double p, bool training, const comm::Group& group,
                           std::int64_t dim);

}  // namespace cohort::tensor_parallel
