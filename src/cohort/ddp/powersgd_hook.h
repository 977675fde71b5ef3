#pragma once
// PowerSGD as a DDP communication hook: each bucket's matrices travel as two thin
// factors of rank r, (n + m) * r numbers instead of n * m (Vogels, Karimireddy and
// Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
// Optimization", NeurIPS 2019). Options and defaults are PyTorch's powerSGD_hook's.
//
//   auto powersgd = cohort::ddp::powersgd_hook(
//       cohort::ddp::PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(100));
//   cohort::ddp::DistributedDataParallel ddp(model, world.group(),
//       cohort::ddp::DistributedDataParallelOptions().comm_hook(powersgd));
//
// Note [PowerSGD step]
// Until start_powerSGD_iter steps have passed, a bucket is all-reduced as it is
// (bitwise the default hook). After that, per bucket:
//  1. With error feedback, the bucket first gets back what compression lost in its
//     last step on this rank (error memory e): x = g + e.
//  2. Gradients of one dimension, and matrices that would not shrink by
//     min_compression_rate, are all-reduced whole, in one flat tensor.
//  3. Every other gradient is viewed as a matrix M (n x m: its first dimension by
//     the rest). Q (m x r) is random (the same generator on every rank, seeded by
//     random_seed), or with warm_start last step's Q; either is orthogonalised. P = M Q
//     is all-reduced (all of the bucket's Ps in one tensor), then orthogonalised;
//     Q = M^T P is all-reduced likewise; the bucket's M becomes P Q^T.
//  4. With error feedback, e = x - (what the bucket now holds) / divisor: PyTorch's
//     (g + e) - average, in the bucket's divided units.
// The memories (e and Q) are kept per parameter (GradBucket::parameters()), not per
// bucket as in PyTorch: DDP rebuilds its buckets after the first step, and a resumed
// run starts from the first plan again, so only the parameter finds its memory in
// both. A parameter whose shape changed starts afresh. start_powerSGD_iter must
// still be at least 2 with error feedback or warm start, as PyTorch requires.
// The memories change only in step 4, and only when the bucket came out finite
// (Note [Non-finite buckets]).
// The bucket arrives divided by the world size (Note [Divide on the way in]), so
// the sums are averages; r is min(n, m, matrix_approximation_rank). The second
// all-reduce depends on the first: it runs when DDP waits for the bucket, at the end
// of backward, so only the first overlaps with backward.
//
// Note [Non-finite buckets]
// With a GradScaler, a step whose gradients overflowed is skipped, and the scale
// backs off. PyTorch's hook stores that step's inf or NaN in its error memory (and
// its warm-start Q), adds it to every later step's gradients, and so every later
// step overflows too: training stops for good. Here an inf or NaN on any rank
// reaches every rank's reduced P, Q or flat rest (inf times anything, or summed
// with anything, is not finite), so every rank sees it without another
// collective. Such a bucket still comes out non-finite on every rank, for the
// scaler to skip the step, but the error memories and Qs of its parameters stay
// as they were before the step, as if the step had not happened. (Other, finite
// buckets of that step keep their update: the memories are per bucket's
// parameters, and the hook cannot know whether the scaler will skip the step.)
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cohort/ddp/comm_hook.h"

namespace cohort::ddp {

struct PowerSGDOptions {
  // r: the rank of the factors. Higher is more exact and sends more.
  TORCH_ARG(std::int64_t, matrix_approximation_rank) = 1;
  // Steps of plain all-reduce before compression starts (warm-up, as PyTorch).
  TORCH_ARG(std::int64_t, start_powerSGD_iter) = 1000;
  // A matrix is compressed only if n * m > (n + m) * r * this.
  TORCH_ARG(double, min_compression_rate) = 2;
  TORCH_ARG(bool, use_error_feedback) = true;
  // Start each step's power iteration from last step's Q.
  TORCH_ARG(bool, warm_start) = true;
  // Added to each column's norm when orthogonalising (0: plain division).
  TORCH_ARG(double, orthogonalization_epsilon) = 0;
  TORCH_ARG(std::uint64_t, random_seed) = 0;
};

class PowerSGDHook : public CommHook {
 public:
  explicit PowerSGDHook(PowerSGDOptions options = PowerSGDOptions());
  std::string name() const override { return "powersgd"; }
  BucketWork start(comm::Group& group, GradBucket& bucket) override;

  const PowerSGDOptions& options() const { return options_; }
  // Steps seen so far (counted at each step's last bucket), PyTorch's state.iter.
  std::int64_t iteration() const { return iteration_; }

  // What this rank sent in its last step, in elements: (n + m) * r per compressed
  // matrix, the uncompressed gradients whole; and what plain all-reduce would send.
  struct Traffic {
    std::int64_t compressed = 0;
    std::int64_t uncompressed = 0;
    std::int64_t dense = 0;
  };
  const Traffic& last_step_traffic() const { return traffic_; }
  // The error memory of the model's parameter `parameter` (GradBucket::parameters()),
  // shaped like its gradient; undefined before its first compressed step.
  at::Tensor error_memory(std::size_t parameter) const;

  // Collective over `group` (DDP's): the hook's state for a checkpoint, every rank's
  // error memories included, identical on every rank.
  std::map<std::string, at::Tensor> state_dict(comm::Group& group) const;
  // Takes back the iteration, the warm-start Qs and the generator; and this rank's
  // error memories when the world size is the one saved (else they restart at zero,
  // and the return value says so: false).
  bool load_state_dict(const std::map<std::string, at::Tensor>& state, comm::Group& group);

 private:
  // Per parameter (GradBucket::parameters()), so that DDP's rebuilt buckets and a
  // resumed run find them.
  struct Memory {
    at::Tensor error;  // shaped like the gradient
    at::Tensor q;      // last step's Q, when the gradient was compressed
    std::vector<std::int64_t> shape;  // the gradient's, which they were made for
  };
  PowerSGDOptions options_;
  std::int64_t iteration_ = 0;
  at::Generator generator_;
  std::map<std::size_t, Memory> memory_;
  c10::Device device_ = c10::kCPU;  // the buckets'; where the memories are gathered
  Traffic traffic_, current_;
};

std::shared_ptr<PowerSGDHook> powersgd_hook(PowerSGDOptions options = PowerSGDOptions());

// Gram-Schmidt over the columns of `matrix` (n x r), in place, as PyTorch's
// powerSGD_hook does; a zero column stays zero. Exposed for tests.
void orthogonalize_columns(at::Tensor& matrix, double epsilon);

}  // namespace cohort::ddp
