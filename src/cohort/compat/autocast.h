#pragma once
// ATen's autocast state, the same call on LibTorch 1.13 and 2.x (Note [LibTorch
// versions] in c10d.h). 1.13 has one function per device (is_cpu_enabled,
// get_autocast_gpu_dtype, ...); 2.4 replaced them with functions that take the
// device type and deprecated the old ones.
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

namespace cohort::compat {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline bool autocast_enabled(c10::DeviceType device) { return at::autocast::is_autocast_enabled(device); }
inline void set_autocast_enabled(c10::DeviceType device, bool on) { at::autocast::set_autocast_enabled(device, on); }
inline at::ScalarType autocast_dtype(c10::DeviceType device) { return at::autocast::get_autocast_dtype(device); }
inline void set_autocast_dtype(c10::DeviceType device, at::ScalarType dtype) {
  at::autocast::set_autocast_dtype(device, dtype);
}
#else
inline bool autocast_enabled(c10::DeviceType device) {
  return device == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
inline void set_autocast_enabled(c10::DeviceType device, bool on) {
  if (device == c10::DeviceType::CPU) at::autocast::set_cpu_enabled(on);
  else at::autocast::set_enabled(on);
}
inline at::ScalarType autocast_dtype(c10::DeviceType device) {
  return device == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype();
}
inline void set_autocast_dtype(c10::DeviceType device, at::ScalarType dtype) {
  if (device == c10::DeviceType::CPU) at::autocast::set_autocast_cpu_dtype(dtype);
  else at::autocast::set_autocast_gpu_dtype(dtype);
}
#endif

}  // namespace cohort::compat
