#pragma once
// Options of zero::fully_shard (ZeRO stage 3), in LibTorch's idiom:
//
//   cohort::zero::FullyShardOptions().reshard_after_forward(false).param_dtype(torch::kBFloat16)
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <optional>

namespace cohort::zero {

struct FullyShardOptions {
  // Free each unit's gathered parameters after its forward, and gather them again
  // before its backward (PyTorch's FULL_SHARD). false keeps them from the forward
  // to the end of the unit's backward: one all-gather fewer per unit and step, for
  // the memory of the gathered units (SHARD_GRAD_OP). The outermost unit is never
  // freed between its forward and its backward, which follows at once.
  TORCH_ARG(bool, reshard_after_forward) = true;
  // Start gathering the next unit while this one computes: in forward the next unit
  // in module order, in backward the one before. Costs one more unit's parameters
  // in memory at a time.
  TORCH_ARG(bool, prefetch) = true;
  // Mixed precision. The unit computes with its parameters gathered in this dtype
  // (floating-point parameters only; the sharded parameters the optimizer steps stay
  // in their own dtype), and floating-point tensor inputs are cast to it.
  TORCH_ARG(std::optional<c10::ScalarType>, param_dtype) = std::nullopt;
  // Gradients are reduced in this dtype (default: param_dtype, else the parameters'
  // own), then added to the sharded gradient in the parameters' dtype.
  TORCH_ARG(std::optional<c10::ScalarType>, reduce_dtype) = std::nullopt;
  // Check at fully_shard() that every rank has the same units, parameters and
  // options, refusing a mismatch on every rank (Note [Replica check without hangs]).
  TORCH_ARG(bool, check_replicas) = true;
};

}  // namespace cohort::zero
