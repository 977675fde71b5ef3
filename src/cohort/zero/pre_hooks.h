#pragma once
// ZeRO-2 and ZeRO-3 take each gradient with a pre-hook on its parameter's
// AccumulateGrad node; a destroyed sharder removes its own hooks (by address) and
// leaves any others in place.
#include <torch/csrc/autograd/function.h>

#include <algorithm>

namespace cohort::zero {

inline void remove_pre_hook(torch::autograd::Node& node, const void* hook) {
  auto& hooks = node.pre_hooks();
  hooks.erase(std::remove_if(hooks.begin(), hooks.end(),
                             [&](const auto& h) { return static_cast<const void*>(h.get()) == hook; }),
              hooks.end());
}

}  // namespace cohort::zero
