#pragma once
// Mixed precision for C++: an RAII guard over ATen's autocast state, the C++ form of
// Python's `with torch.autocast(device_type, dtype):`.
//
//   {
//     cohort::amp::Autocast autocast{cohort::amp::AutocastOptions(torch::kCPU)};  // bf16 on the CPU
//     auto loss = criterion(model->forward(x), y);   // matmuls and convolutions in bf16
//   }                                                // state restored, cast cache cleared
//   loss.backward();                                 // backward outside the guard, as in Python
//
// Guards nest: an inner one may change the dtype or disable autocast, and each exit
// restores what its entry found. Leaving the outermost guard clears the cache of
// weight casts, so a weight changed by the optimizer is cast again next step.
//
// Note [Nested cast cache]
// The cache is cleared only when the outermost guard exits. An inner guard that
// turned the cache on inside an outer one that had it off would fill it, and its
// casts would outlive the inner guard: the next step's inner guard would use the
// casts of weights the optimizer has since changed. So a guard's cache is on only
// if its option says so and it was on where the guard was entered; the exit
// restores exactly what the entry found. PyTorch's torch.autocast inherits the
// outer setting when cache_enabled is not given (our default gives the same), but
// lets an explicit cache_enabled=True turn it back on, with the stale casts above.
// The state is per thread; LocalPipeline and DataParallel carry it to their device
// threads.
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <optional>
#include <string>

namespace cohort::amp {

struct AutocastOptions {
  /* implicit */ AutocastOptions(c10::DeviceType device_type = c10::DeviceType::CPU) : device_type_(device_type) {}
  TORCH_ARG(c10::DeviceType, device_type);
  // The lower precision: bfloat16 on the CPU (the only one it takes), float16 by
  // default on CUDA (bfloat16 also works there).
  TORCH_ARG(std::optional<c10::ScalarType>, dtype) = std::nullopt;
  TORCH_ARG(bool, enabled) = true;
  // Keep casts of leaf tensors (weights) for the guard's lifetime. A guard nested in
  // one that disabled the cache leaves it disabled (Note [Nested cast cache]).
  TORCH_ARG(bool, cache_enabled) = true;
};

// "bf16" -> BFloat16, "fp16" -> Half; "off" -> nullopt. ConfigError on anything else.
std::optional<c10::ScalarType> parse_amp_dtype(const std::string& name);

class Autocast {
 public:
  // ConfigError for a device or dtype autocast does not support (float16 on the CPU,
  // a device type other than CPU and CUDA).
  explicit Autocast(AutocastOptions options = AutocastOptions());
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  c10::DeviceType device_;
  bool was_enabled_;
  c10::ScalarType previous_dtype_;
  bool previous_cache_;
};

}  // namespace cohort::amp
