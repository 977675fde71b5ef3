#pragma once
// --amp bf16|fp16|off: autocast around the forward and the loss, and for fp16 a
// GradScaler whose skipped steps every rank agrees on (cohort::amp, docs/amp.md).
#include <torch/optim/optimizer.h>

#include <memory>
#include <optional>

#include "cohort/amp/autocast.h"
#include "cohort/amp/grad_scaler.h"
#include "cohort/checkpoint/checkpointer.h"
#include "cohort/comm/group.h"
#include "options.h"

namespace fashion_mnist {

class MixedPrecision {
 public:
  // ConfigError when the device cannot run the mode (fp16 on the CPU).
  MixedPrecision(const TrainerOptions& o, c10::Device device, cohort::comm::Group group);

  // The guard to hold over the forward and the loss; null with --amp off.
  std::unique_ptr<cohort::amp::Autocast> autocast() const;
  // The loss to call backward() on: scaled under fp16, as it is otherwise.
  at::Tensor scale(const at::Tensor& loss) { return scaler_.scale(loss); }
  // optimizer.step() (skipped after an overflow under fp16), then the scaler's update.
  // Returns whether the optimizer stepped.
  bool step(torch::optim::Optimizer& optimizer);
  int skipped_steps() const { return skipped_; }
  double loss_scale() const { return scaler_.is_enabled() ? scaler_.get_scale() : 1.0; }

  // The scaler's state travels in the checkpoint's trainer state.
  void save(cohort::checkpoint::TrainingProgress& progress) const;
  void restore(const cohort::checkpoint::TrainingProgress& progress);

 private:
  std::optional<c10::ScalarType> dtype_;
  c10::DeviceType device_type_;
  cohort::amp::GradScaler scaler_;
  int skipped_ = 0;
};

}  // namespace fashion_mnist
