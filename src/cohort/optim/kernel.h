#pragma once
// How cohort::optim's optimizers run their step, in PyTorch's words:
//   for_loop  torch::optim's own step: a few small operators per parameter.
//   foreach   ATen's _foreach_ operators: each operator once over a list of
//             parameters (one launch per list on CUDA).
//   fused     one ATen kernel for the whole update of a list (LibTorch >= 2.4, CPU
//             and CUDA; compat/fused_optimizer.h).
//   automatic fused where the LibTorch and the parameters' device and dtype have it,
//             else foreach on an accelerator, else for_loop.
// Note [Why for_loop on the CPU without fused]: on the CPU, ATen runs a _foreach_
// operator as a loop over the same per-tensor operators, so it dispatches more
// operators than the for-loop (the list operators on top of them) and allocates the
// intermediate lists; it saves nothing there.
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

namespace cohort::optim {

enum class StepKernel { automatic, for_loop, foreach, fused };

// "auto", "for-loop", "foreach", "fused".
std::string to_string(StepKernel kernel);
// The inverse of to_string; throws ConfigError naming the accepted values.
StepKernel parse_step_kernel(const std::string& text);

// The kernel a step of tensors of this device and dtype runs. An explicit `fused`
// where this LibTorch or device has none throws ConfigError with the fix.
StepKernel resolve(StepKernel wanted, const c10::Device& device, c10::ScalarType dtype);

}  // namespace cohort::optim
