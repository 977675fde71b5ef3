#pragma once
// Which rank owns which parameter under ZeRO (zero/sharded_optimizer.h).
//
// Note [Balanced partition]
// The largest parameter first (ties by position), each to the rank that owns the
// fewest bytes so far (ties to the lowest rank), as PyTorch's
// ZeroRedundancyOptimizer does. It depends on the sizes alone, so every rank
// computes the same partition without a word exchanged, and no rank owns more than
// the average plus the largest parameter.
#include <cstdint>
#include <vector>

namespace cohort::zero {

// owner[i] for each parameter of `bytes[i]` bytes, over `world_size` ranks.
std::vector<int> partition_by_size(const std::vector<std::int64_t>& bytes, int world_size);

}  // namespace cohort::zero
