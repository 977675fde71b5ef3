#pragma once
// What the ZeRO tests of unused parameters share (Note [Unused parameters under
// ZeRO-2] and [... ZeRO-3]): an AdamW, and the steps' batches, made before the
// threads start (seeding is process-wide).
#include <torch/torch.h>

#include <memory>
#include <vector>

namespace cohort::testing {

// Its weight decay would move a parameter whose gradient is zero: one that should
// have been skipped shows.
inline std::unique_ptr<torch::optim::Optimizer> adamw(std::vector<torch::Tensor> p) {
  return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
}

// `steps` batches of `world` ranks' `rows` rows each: inputs of 6 features,
// targets of 3.
class StepBatches {
 public:
  StepBatches(int steps, int world, int rows) : rows_(rows) {
    torch::manual_seed(5);
    for (int s = 0; s < steps; ++s) {
      xs_.push_back(torch::randn({world * rows, 6}));
      ys_.push_back(torch::randn({world * rows, 3}));
    }
  }
  // Rank r's rows of step s.
  torch::Tensor x(int s, int r) const { return xs_[s].narrow(0, r * rows_, rows_); }
  torch::Tensor y(int s, int r) const { return ys_[s].narrow(0, r * rows_, rows_); }

 private:
  int rows_;
  std::vector<torch::Tensor> xs_, ys_;
};

}  // namespace cohort::testing
