#pragma once
// Which samples each live replica trains on at a step, when the number of replicas
// changes from step to step.
//
// Note [A global batch per step]
// Step s of epoch e takes the next `global_batch` samples of epoch e's order
// (shuffled with seed + e, the same on every replica), and the quorum's members
// split them in contiguous, nearly equal parts by quorum rank. The step, not the
// replica, owns the samples: a step redone after a failure takes the same samples,
// split over the survivors, so every sample is seen exactly once per epoch however
// the quorum shrinks and grows. With loss_weight() applied to each replica's mean
// loss, DDP's average over the quorum is the mean over the global batch whatever
// the split: the weights a run reaches do not depend on when replicas come and go.
#include <torch/arg.h>

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace cohort::fault_tolerance {

struct StepSamplerOptions {
  StepSamplerOptions(std::int64_t dataset_size, std::int64_t global_batch)
      : dataset_size_(dataset_size), global_batch_(global_batch) {}
  TORCH_ARG(std::int64_t, dataset_size);
  TORCH_ARG(std::int64_t, global_batch);
  TORCH_ARG(bool, shuffle) = true;
  TORCH_ARG(std::uint64_t, seed) = 0;
};

class StepSampler {
 public:
  // Throws ConfigError when global_batch is not in [1, dataset_size].
  explicit StepSampler(StepSamplerOptions options);
  // Whole global batches per epoch (the last partial batch is dropped).
  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  std::int64_t epoch_of(std::int64_t step) const { return step / steps_per_epoch_; }
  // The dataset indices replica `rank` of `size` trains on at `step`.
  std::vector<std::int64_t> indices(std::int64_t step, int rank, int size);
  // What to multiply this replica's mean loss by (Note [A global batch per step]).
  double loss_weight(std::int64_t step, int rank, int size) const;

 private:
  std::pair<std::int64_t, std::int64_t> part(int rank, int size) const;
  StepSamplerOptions options_;
  std::int64_t steps_per_epoch_;
  std::int64_t cached_epoch_ = -1;
  at::Tensor order_;
};

}  // namespace cohort::fault_tolerance
