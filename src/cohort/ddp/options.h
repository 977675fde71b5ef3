#pragma once
// Options of DistributedDataParallel, in LibTorch's idiom:
//
//   auto ddp = cohort::ddp::DistributedDataParallel(model, world.group(),
//       cohort::ddp::DistributedDataParallelOptions()
//           .bucket_cap_bytes(50 << 20)
//           .gradient_as_bucket_view(true));
//
// The defaults are PyTorch's.
#include <torch/arg.h>

#include <cstdint>
#include <memory>

namespace cohort::ddp {

class CommHook;

struct DistributedDataParallelOptions {
  // Gradients travel in buckets of about this many bytes (Note [Bucket ready order]).
  TORCH_ARG(std::int64_t, bucket_cap_bytes) = 25 * 1024 * 1024;
  // The first bucket to be reduced is smaller, so communication starts early in backward.
  TORCH_ARG(std::int64_t, first_bucket_cap_bytes) = 1024 * 1024;
  // Parameters' .grad become views into the buckets: no copy in or out, and no second
  // copy of the gradients in memory. zero_grad() keeps working; a .grad you replace
  // is copied into its bucket at the next backward. LibTorch 2.x's zero_grad()
  // sets .grad to none by default, so autograd allocates a fresh gradient each step
  // that is then copied in; use zero_grad(/*set_to_none=*/false) (or
  // Module::zero_grad(false)) to keep the gradients in the buckets throughout.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  // Walk the autograd graph after each forward to find parameters that will get no
  // gradient, and reduce them as zeros. Needed when forward skips parameters, or the
  // loss ignores some of forward's outputs (their parameters, found at the end of
  // backward, are reduced as zeros then); it costs one graph walk and one small
  // all-reduce per step.
  TORCH_ARG(bool, find_unused_parameters) = false;
  // Broadcast buffers (e.g. BatchNorm's running statistics) from rank 0 before the
  // first forward after each synchronised training forward, so that every rank
  // trains and evaluates the same model (Note [When buffers are synchronised]).
  TORCH_ARG(bool, broadcast_buffers) = true;
  // Promise that every iteration uses the same parameters: the set of unused
  // parameters is found once, in the first iteration, instead of by a graph walk in
  // every iteration (without find_unused_parameters' per-step cost).
  TORCH_ARG(bool, static_graph) = false;
  // Check at construction that every rank wraps the same parameters
  // (Note [Replica check without hangs]).
  TORCH_ARG(bool, check_replicas) = true;
  // How a bucket is reduced; null means all-reduce and average (AllReduceHook).
  TORCH_ARG(std::shared_ptr<CommHook>, comm_hook) = nullptr;
  // Record when each bucket became ready, was launched and finished, for
  // benchmarks (DistributedDataParallelBase::last_timings()). Off: no clock reads.
  TORCH_ARG(bool, record_timings) = false;
};

}  // namespace cohort::ddp
