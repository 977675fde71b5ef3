#pragma once
#include <torch/csrc/distributed/c10d/Types.hpp>

namespace cohort::comm {

// kAvg is computed as a sum followed by a division, since Gloo has no average.
enum class ReduceOp { kSum, kAvg, kProduct, kMin, kMax };

c10d::ReduceOp to_c10d(ReduceOp op);
const char* to_string(ReduceOp op);

}  // namespace cohort::comm
