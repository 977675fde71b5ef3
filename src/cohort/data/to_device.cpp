#include "cohort/data/to_device.h"

#include <ATen/ATen.h>

namespace cohort::data {

at::Tensor to_device(const at::Tensor& batch, const c10::Device& device) {
  if (batch.device() == device) return batch;
  if (device.is_cuda() && batch.device().is_cpu()) {
    const auto pinned = batch.is_pinned() ? batch : batch.pin_memory();
    return pinned.to(device, /*non_blocking=*/true);
  }
  return batch.to(device);
}

}  // namespace cohort::data
