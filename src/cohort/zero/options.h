#pragma once
// Options of zero::ShardedOptimizer, in LibTorch's idiom:
//
//   cohort::zero::ShardedOptimizerOptions().bucket_cap_bytes(8 << 20)
#include <torch/arg.h>

#include <cstdint>

namespace cohort::zero {

struct ShardedOptimizerOptions {
  // Updated parameters travel from their owners in buckets of about this many bytes
  // (one broadcast each; a larger parameter travels alone). Every rank must give the
  // same value: it decides the collectives.
  TORCH_ARG(std::int64_t, bucket_cap_bytes) = 25 * 1024 * 1024;
  // Check at construction that every rank passes the same parameters (shapes and
  // dtypes) and the same options, refusing a mismatch on every rank (Note [Replica
  // check without hangs] in ddp/replica_check.h).
  TORCH_ARG(bool, check_replicas) = true;
  // ZeRO stage 2: each gradient is reduced to its parameter's owner only, which alone
  // keeps it (Note [ZeRO-2 gradients] in zero/gradient_sharder.h). The optimizer then
  // does DDP's work itself: do not wrap the model in DDP. bucket_cap_bytes also sizes
  // the gradient buckets.
  TORCH_ARG(bool, shard_gradients) = false;
};

}  // namespace cohort::zero
