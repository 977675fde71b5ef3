#pragma once
// The key of a parameter in torch::optim::Optimizer::state(): its TensorImpl's
// address printed as a string in 1.13, the address itself in 2.x.
#include <ATen/core/Tensor.h>
#include <c10/util/string_utils.h>
#include <torch/version.h>

#include <string>

namespace cohort::compat {

#if TORCH_VERSION_MAJOR >= 2
using OptimizerStateKey = void*;
inline OptimizerStateKey optimizer_state_key(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }
#else
using OptimizerStateKey = std::string;
inline OptimizerStateKey optimizer_state_key(const at::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}
#endif

}  // namespace cohort::compat
