#pragma once
// The fused optimizer kernels of ATen (one kernel for a whole list of parameters),
// where the LibTorch built against has them: _fused_adam_, _fused_adamw_ and
// _fused_sgd_ for CUDA and CPU tensors in 2.x (CPU since 2.4). LibTorch 1.13 has
// only a CUDA _fused_adam_ that nothing here has been run against, so it counts as
// none; cohort::optim then uses the _foreach_ kernels.
#include <ATen/ATen.h>
#include <torch/version.h>

namespace cohort::compat {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline constexpr bool kHasFusedOptimizers = true;

// True when ATen has fused optimizer kernels for tensors of this device and dtype.
inline bool fused_optimizer_supports(const at::Device& device, at::ScalarType dtype) {
  if (!device.is_cpu() && !device.is_cuda()) return false;
  return dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16;
}

// Note [Fused step counts]: the fused kernels read each parameter's step (after
// this step's increment) from a float tensor on the parameters' device. torch::optim
// keeps the step as a host integer in its parameter state, which is what its state
// dicts hold, so the caller passes one scalar tensor of that count for every
// parameter of a list that shares it: no state beyond torch::optim's.
// `lr` is a double, or (Note [A step inside a CUDA graph] in optim/capturable.h) a
// 0-dim tensor on the parameters' device, which the kernels read when they run.
template <class Lr>
inline void fused_adam_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                        at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs, at::TensorList steps,
                        const Lr& lr, double beta1, double beta2, double weight_decay, double eps, bool amsgrad,
                        bool decoupled) {
  if (decoupled)
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1, beta2, weight_decay, eps,
                      amsgrad, /*maximize=*/false);
  else
    at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1, beta2, weight_decay, eps,
                     amsgrad, /*maximize=*/false);
}

template <class Lr>
inline void fused_sgd_(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                       double weight_decay, double momentum, const Lr& lr, double dampening, bool nesterov,
                       bool first_step) {
  at::_fused_sgd_(params, grads, momentum_buffers, weight_decay, momentum, lr, dampening, nesterov,
                  /*maximize=*/false, first_step);
}
#else
inline constexpr bool kHasFusedOptimizers = false;
inline bool fused_optimizer_supports(const at::Device&, at::ScalarType) { return false; }
template <class Lr>
inline void fused_adam_(at::TensorList, at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                        at::TensorList, const Lr&, double, double, double, double, bool, bool) {
  TORCH_CHECK(false, "cohort: this LibTorch has no fused optimizer kernels (LibTorch 2.4 or newer has them)");
}
template <class Lr>
inline void fused_sgd_(at::TensorList, at::TensorList, at::TensorList, double, double, const Lr&, double, bool, bool) {
  TORCH_CHECK(false, "cohort: this LibTorch has no fused optimizer kernels (LibTorch 2.4 or newer has them)");
}
#endif

}  // namespace cohort::compat
