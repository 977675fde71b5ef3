#pragma once
// Which parameters will receive a gradient from a backward over `outputs`: the
// parameters whose gradient accumulators are reachable from the outputs' autograd
// graph. DDP uses it (find_unused_parameters, static_graph) to reduce the others as
// zeros instead of waiting for gradients that will never come.
//
// Note [Parameters behind a custom function]
// A custom autograd function (torch::autograd::Function, a CppNode) may run a
// backward of its own inside its backward: cohort::recompute::checkpoint without
// .modules() recomputes its segment and differentiates it into the parameters'
// .grad, as PyTorch's reentrant checkpoint does. The parameters of that segment
// are not edges of the node, so no walk can see them, yet their gradients arrive,
// later than the walk's answer. When the walk meets such a node, its answer for the
// parameters it could not reach is "maybe": DDP then waits for them until the end
// of backward instead of reducing them as zeros at once (pytorch#24005's problem,
// solved by waiting instead of refusing).
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <vector>

#include "cohort/compat/autograd.h"

namespace cohort::ddp {

struct Reachability {
  std::vector<bool> used;  // used[i]: accumulators[i] is reachable from some output
  // Some node on the way is a custom autograd function, behind which unreachable
  // parameters may still get gradients (Note [Parameters behind a custom function]).
  bool through_custom_function = false;
};

// The walk visits each autograd node once.
Reachability reachable_accumulators(const std::vector<at::Tensor>& outputs,
                                    const std::vector<compat::NodePtr>& accumulators);

}  // namespace cohort::ddp
