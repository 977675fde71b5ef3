#pragma once
// How many bytes of tensors an optimizer's state holds (momentum buffers, Adam's
// moments, ...), for the memory reports of ZeRO (docs/zero.md).
#include <torch/optim/optimizer.h>

#include <cstdint>

namespace cohort::zero {

// The state of torch::optim's SGD, Adam, AdamW, Adagrad and RMSprop is counted
// tensor by tensor; another optimizer's by the size of its serialized state.
std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace cohort::zero
