#pragma once
// Loss scaling for float16 training, with PyTorch's semantics and defaults (Python's
// torch.amp.GradScaler), and agreement across ranks.
//
//   cohort::amp::GradScaler scaler(cohort::amp::GradScalerOptions(), world.group());
//   for (...) {
//     optimizer.zero_grad();
//     {
//       cohort::amp::Autocast autocast{cohort::amp::AutocastOptions(torch::kCUDA)};
//       loss = criterion(ddp->forward(x), y);
//     }
//     scaler.scale(loss).backward();   // gradients scaled by scale()
//     scaler.unscale_(optimizer);      // optional: true gradients, e.g. to clip them
//     torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
//     scaler.step(optimizer);          // skipped when any rank found inf or NaN
//     scaler.update();                 // back off after a skip, grow after growth_interval clean steps
//   }
//
// Note [Agreeing on overflow]
// Each rank checks its own gradients for inf and NaN. DDP's averaged gradients are
// usually equal, but not always: a communication hook compresses them, no_sync
// leaves them local, a rank's gradient of a parameter outside the reducer, or a
// sharded optimizer. If one rank skipped a step and another did not, their weights
// and scales would drift apart for good. So unscale_ all-reduces the found-inf flag
// (MAX) over the group before anyone decides: every rank skips the same steps and
// keeps the same scale. One small all-reduce per optimizer and step.
//
// Note [A float32 scale]
// PyTorch keeps the scale in a float32 tensor: init_scale is rounded to float32 on
// construction, and each backoff or growth multiplies in double and rounds back to
// float32 (_amp_update_scale_). So does the scale here, a float, so that a scale
// that is not a power of two (init_scale 1000.1, backoff_factor 0.3) follows
// PyTorch's sequence bitwise, and the inverse used to unscale is float32 1 / scale.
#include <ATen/core/Tensor.h>
#include <ATen/core/Dict.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <optional>

#include "cohort/comm/group.h"

namespace cohort::amp {

struct GradScalerOptions {
  TORCH_ARG(double, init_scale) = 65536.0;
  TORCH_ARG(double, growth_factor) = 2.0;
  TORCH_ARG(double, backoff_factor) = 0.5;
  TORCH_ARG(std::int64_t, growth_interval) = 2000;
  // Disabled, every call passes through: scale() returns the loss, step() steps.
  TORCH_ARG(bool, enabled) = true;
};

class GradScaler {
 public:
  // `group`: the ranks that must agree on skipping (Note [Agreeing on overflow]);
  // none for one process. ConfigError for factors or intervals PyTorch would refuse.
  explicit GradScaler(GradScalerOptions options = GradScalerOptions(), std::optional<comm::Group> group = std::nullopt);

  // loss * scale, in the loss's dtype and on its device.
  at::Tensor scale(const at::Tensor& loss);
  // Divides the gradients of `optimizer`'s parameters by the scale in place and
  // records whether any rank found inf or NaN in them. Once per optimizer between
  // update()s: a second call is an error, as is a call after step().
  void unscale_(torch::optim::Optimizer& optimizer);
  // unscale_ if not done yet; then optimizer.step() unless an overflow was found.
  // Returns whether the optimizer stepped.
  bool step(torch::optim::Optimizer& optimizer);
  // After the step(s) of an iteration: halves (backoff_factor) the scale if any of
  // them found an overflow, else counts a clean step and grows it (growth_factor)
  // after growth_interval of them.
  void update();

  // The float32 scale, widened (Note [A float32 scale]).
  double get_scale() const { return scale_; }
  std::int64_t growth_tracker() const { return growth_tracker_; }
  bool is_enabled() const { return options_.enabled(); }
  const GradScalerOptions& options() const { return options_; }

  // PyTorch's keys: scale, growth_factor, backoff_factor, growth_interval,
  // _growth_tracker. Empty when disabled.
  c10::impl::GenericDict state_dict() const;
  // DataError naming the key for a dict that is not a scaler's.
  void load_state_dict(const c10::impl::GenericDict& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    bool found_inf = false;
  };

  GradScalerOptions options_;
  std::optional<comm::Group> group_;
  float scale_;  // Note [A float32 scale]
  std::int64_t growth_tracker_ = 0;
  std::map<const torch::optim::Optimizer*, PerOptimizer> per_optimizer_;
  std::optional<c10::Device> device_;  // where the found-inf flag is reduced: the loss's
};

}  // namespace cohort::amp
