#include "cohort/optim/kernel.h"

#include <torch/version.h>

#include "cohort/compat/fused_optimizer.h"
#include "cohort/errors.h"

namespace cohort::optim {

std::string to_string(StepKernel kernel) {
  switch (kernel) {
    case StepKernel::automatic: return "auto";
    case StepKernel::for_loop: return "for-loop";
    case StepKernel::foreach: return "foreach";
    case StepKernel::fused: return "fused";
  }
  return "?";
}

StepKernel parse_step_kernel(const std::string& text) {
  for (auto k : {StepKernel::automatic, StepKernel::for_loop, StepKernel::foreach, StepKernel::fused})
    if (text == to_string(k)) return k;
  throw ConfigError("cohort optimizer: unknown step kernel '" + text +
                    "'; use auto, for-loop, foreach or fused (docs/optimizers.md)");
}

StepKernel resolve(StepKernel wanted, const c10::Device& device, c10::ScalarType dtype) {
  const bool fused = compat::fused_optimizer_supports(device, dtype);
  if (wanted == StepKernel::fused && !fused)
    throw ConfigError(std::string("cohort optimizer: no fused kernel for ") + c10::toString(dtype) + " parameters on " +
                      device.str() + " in LibTorch " + TORCH_VERSION +
                      " (fused kernels need LibTorch 2.4 or newer, and CPU or CUDA parameters of a floating type); "
                      "fix: use StepKernel::foreach or StepKernel::automatic");
  if (wanted != StepKernel::automatic) return wanted;
  if (fused) return StepKernel::fused;
  return device.is_cpu() ? StepKernel::for_loop : StepKernel::foreach;
}

}  // namespace cohort::optim
