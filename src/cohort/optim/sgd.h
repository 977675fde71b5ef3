#pragma once
// SGD (with momentum, dampening, Nesterov and weight decay) whose step runs over
// lists of parameters or in one fused kernel; torch::optim::SGD otherwise, with its
// options, its SGDParamState and so its state dicts (docs/optimizers.md).
//
//   cohort::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
#include <torch/optim/sgd.h>

#include "cohort/optim/capturable.h"
#include "cohort/optim/kernel.h"

namespace cohort::optim {

class SGD : public torch::optim::SGD, public Capturable {
 public:
  explicit SGD(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::SGDOptions defaults,
               StepKernel kernel = StepKernel::automatic);
  explicit SGD(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults,
               StepKernel kernel = StepKernel::automatic);
  at::Tensor step(LossClosure closure = nullptr) override;
  StepKernel kernel() const { return kernel_; }
  // Note [A step inside a CUDA graph] (capturable.h): the learning rate from the
  // device. SGD keeps no step count; its first step (which makes the momentum
  // buffers) must run eagerly.
  SGD& capturable(bool on);
  bool capturable() const override { return device_.on; }
  void load_learning_rates() override;
  void count_steps(int) override {}
  void reset_device_state() override { device_.lrs.clear(); }

 private:
  StepKernel kernel_;
  DeviceStepState device_;
};

}  // namespace cohort::optim
