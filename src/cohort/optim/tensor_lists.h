#pragma once
// What cohort::optim's steps share: the parameters of a group that have gradients,
// and their split into lists that one _foreach_ or fused call can take.
#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cohort/optim/kernel.h"

namespace cohort::optim {

// The parameters of `group` that have a gradient, in order. Throws ConfigError for
// a sparse gradient, or a gradient on another device or of another dtype than its
// parameter, naming the optimizer (`who`) and the parameter's index in the group.
std::vector<at::Tensor> params_with_grads(const torch::optim::OptimizerParamGroup& group, const std::string& who);

// Note [One call per list]: a _foreach_ or fused call takes tensors of one device and
// dtype, and the hyperparameters it is given (Adam's bias correction, SGD's first
// step) must hold for every tensor of the list, so the lists split on `extra` too
// (Adam's step count, whether SGD's momentum buffer exists). In a model trained from
// the start every parameter shares it, so that is one list per device and dtype.
struct TensorList {
  c10::Device device;
  c10::ScalarType dtype;
  std::int64_t extra = 0;
  std::vector<std::size_t> members;  // indices into the tensors split
};
std::vector<TensorList> split_lists(const std::vector<at::Tensor>& tensors,
                                    const std::function<std::int64_t(std::size_t)>& extra);

// The tensors of `all` at a list's members.
std::vector<at::Tensor> pick(const std::vector<at::Tensor>& all, const TensorList& list);

// Runs `closure` with gradients on, as torch::optim's steps do; an undefined tensor
// without one.
at::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure);

// ---- capturable steps (Note [A step inside a CUDA graph], capturable.h) ----
struct DeviceStepState;
// Throws ConfigError unless `wanted` can run capturable here: fused or automatic, on
// a LibTorch with fused kernels.
void require_capturable(StepKernel wanted, const std::string& who);
// Turns capturable on (after require_capturable) or off (forgetting the device state).
void set_capturable(DeviceStepState& state, bool on, StepKernel wanted, const std::string& who);
// Writes every group's learning rate into state.lrs (one 0-dim float tensor per
// group, on its first parameter's device).
void load_learning_rates(torch::optim::Optimizer& optimizer, DeviceStepState& state);
// Group `index`'s learning rate tensor; throws if load_learning_rates never ran.
const at::Tensor& learning_rate_tensor(const DeviceStepState& state, std::size_t index, const std::string& who);
// The device step counts of `params` (made from `host_counts`, the counts before
// this step, where missing), incremented by one on the device.
std::vector<at::Tensor> advance_device_steps(DeviceStepState& state, const std::vector<at::Tensor>& params,
                                             const std::vector<std::int64_t>& host_counts);

}  // namespace cohort::optim
