#pragma once
// A host batch onto the training device without making the host wait: on CUDA the
// batch is staged in page-locked (pinned) memory and copied with non_blocking, so the
// copy is queued on the current stream behind the work already there, and the host
// goes on to queue the step. On the CPU, or for a tensor already on `device`, the
// tensor itself comes back.
//
// Note [Pinned staging outlives the copy]: the pinned buffer is freed when the
// returned tensor's source goes out of scope, before the copy may have run; LibTorch's
// pinned-memory allocator records the copy's stream on the block and reuses it only
// after the stream passes that point, so this is safe without a sync.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace cohort::data {

at::Tensor to_device(const at::Tensor& batch, const c10::Device& device);

}  // namespace cohort::data
