#pragma once
// The collective helpers that Checkpointer's save and load share. Internal: not
// installed, included by checkpointer*.cpp only.
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <string>

#include "cohort/comm/group.h"

namespace cohort::checkpoint {

// One code per rank, combined so that every rank learns the largest.
inline std::int64_t max_over_ranks(comm::Group& group, std::int64_t code, c10::Device device) {
  auto flag = torch::full({1}, code, torch::dtype(torch::kInt64).device(device));
  group.all_reduce(flag, comm::ReduceOp::kMax);
  return flag.item<std::int64_t>();
}

// One flag per rank, combined so that every rank learns whether any rank failed.
inline bool any_rank(comm::Group& group, bool failed, c10::Device device) {
  return max_over_ranks(group, failed ? 1 : 0, device) != 0;
}

// LibTorch's serialized optimizer state (optimizer.pt).
std::string optimizer_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace cohort::checkpoint
