#pragma once
// Which parameters will receive a gradient from a backward over `outputs`: the
// parameters whose gradient accumulators are reachable from the outputs' autograd
// graph. DDP uses it (find_unused_parameters, static_graph) to reduce the others as
// zeros instead of waiting for gradients that will never come.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <vector>

namespace cohort::ddp {

// used[i] is true when accumulators[i] is reachable from some output that requires
// grad. The walk visits each autograd node once.
std::vector<bool> reachable_accumulators(const std::vector<at::Tensor>& outputs,
                                         const std::vector<std::shared_ptr<torch::autograd::Node>>& accumulators);

}  // namespace cohort::ddp
