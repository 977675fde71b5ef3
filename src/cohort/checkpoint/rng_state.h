#pragma once
// The state of LibTorch's default random generators, so that a resumed run draws the
// same random numbers (dropout masks, augmentations, initialisations) as a run that
// was never interrupted.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

namespace cohort::checkpoint {

// The CPU generator's state, followed by `device`'s generator's state when it is a
// CUDA device. Each is a uint8 tensor on the CPU.
std::vector<at::Tensor> capture_rng_state(c10::Device device);
// Restores what capture_rng_state(device) returned.
void restore_rng_state(c10::Device device, const std::vector<at::Tensor>& state);

}  // namespace cohort::checkpoint
