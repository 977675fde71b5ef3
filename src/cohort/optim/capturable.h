#pragma once
// Optimizers whose step a CUDA graph can capture and replay (cohort::optim's Adam,
// AdamW and SGD with capturable(true); cohort::cuda_graphs::CapturedStep drives them).
//
// Note [A step inside a CUDA graph]
// A graph replays the kernels it captured with the arguments they had then: a host
// number passed to a kernel (the learning rate, Adam's step count for its bias
// corrections) is frozen into it. So a capturable optimizer keeps what changes from
// step to step in device tensors that its kernels read:
//  - each param group's learning rate, a 0-dim float tensor on the parameters'
//    device, which load_learning_rates() writes from the group's options, eagerly
//    (outside the graph), before every step, captured, replayed or eager;
//  - each parameter's step count, a 0-dim float tensor that the step increments on
//    the device (inside the graph), made from the host count by the first step, which
//    must run eagerly: CapturedStep's warm-up steps do.
// The host keeps torch::optim's integer step counts too, which state dicts and
// checkpoints hold: a capture counted a step that did not run (count_steps(-1) after
// it), and each replay took a step the host did not see (count_steps(+1)).
// Only the fused kernels take both as tensors (LibTorch >= 2.4); capturable(true)
// with another kernel, or on LibTorch 1.13, is refused with the fix.
// Loading a state dict after the device counts exist leaves them stale: call
// reset_device_state() after loading (the next step remakes them from the host).
#include <ATen/core/Tensor.h>

#include <unordered_map>
#include <vector>

namespace cohort::optim {

class Capturable {
 public:
  virtual ~Capturable() = default;
  virtual bool capturable() const = 0;
  // Writes each group's learning rate into its device tensor (making it if needed).
  virtual void load_learning_rates() = 0;
  // Adds `delta` to the host step count of every parameter with state.
  virtual void count_steps(int delta) = 0;
  // Forgets the device copies of the step counts and learning rates.
  virtual void reset_device_state() = 0;
};

// What a capturable optimizer keeps on the device (Note [A step inside a CUDA graph]).
struct DeviceStepState {
  bool on = false;
  std::vector<at::Tensor> lrs;                               // per param group
  std::unordered_map<const void*, at::Tensor> steps;         // per parameter (TensorImpl*)
};

}  // namespace cohort::optim
