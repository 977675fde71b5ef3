#pragma once
// Adam and AdamW whose step runs as PyTorch's default does on a GPU: over lists of
// parameters (_foreach_ operators) or in one fused kernel, instead of
// torch::optim's few small operators per parameter (docs/optimizers.md).
//
//   cohort::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-4).weight_decay(0.1));
//   cohort::optim::Adam sgd_like(params, torch::optim::AdamOptions(1e-3), cohort::optim::StepKernel::foreach);
//
// They are torch::optim::Adam and AdamW with another step: the same options, the
// same parameter state (AdamParamState, AdamWParamState) and so the same state dicts
// and checkpoints, in both directions, and ZeRO's sharded optimizers take them from
// their factory as they take torch::optim's. With StepKernel::for_loop or foreach
// the update is torch::optim's to the bit; fused agrees within float rounding.
// capturable(true) keeps the learning rate and step counts on the device, so that a
// CUDA graph can replay the step (Note [A step inside a CUDA graph], capturable.h).
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include "cohort/optim/capturable.h"
#include "cohort/optim/kernel.h"

namespace cohort::optim {

class Adam : public torch::optim::Adam, public Capturable {
 public:
  explicit Adam(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamOptions defaults = {},
                StepKernel kernel = StepKernel::automatic);
  explicit Adam(std::vector<at::Tensor> params, torch::optim::AdamOptions defaults = {},
                StepKernel kernel = StepKernel::automatic);
  at::Tensor step(LossClosure closure = nullptr) override;
  StepKernel kernel() const { return kernel_; }
  // Throws ConfigError where the fused kernel cannot run (LibTorch 1.13, another kernel).
  Adam& capturable(bool on);
  bool capturable() const override { return device_.on; }
  void load_learning_rates() override;
  void count_steps(int delta) override;
  void reset_device_state() override;

 private:
  StepKernel kernel_;
  DeviceStepState device_;
};

class AdamW : public torch::optim::AdamW, public Capturable {
 public:
  explicit AdamW(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions defaults = {},
                 StepKernel kernel = StepKernel::automatic);
  explicit AdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults = {},
                 StepKernel kernel = StepKernel::automatic);
  at::Tensor step(LossClosure closure = nullptr) override;
  StepKernel kernel() const { return kernel_; }
  // Throws ConfigError where the fused kernel cannot run (LibTorch 1.13, another kernel).
  AdamW& capturable(bool on);
  bool capturable() const override { return device_.on; }
  void load_learning_rates() override;
  void count_steps(int delta) override;
  void reset_device_state() override;

 private:
  StepKernel kernel_;
  DeviceStepState device_;
};

}  // namespace cohort::optim
