#pragma once
// Which strategies compose with tensor parallelism on a device mesh, checked before
// anything is built: a combination cohort cannot run, or has not proven equal to
// one process (tests/multiproc/tensor_parallel_gpt_test.cpp), is refused with a
// ConfigError that names it and says what to use instead (docs/tensor_parallel.md,
// "Composition"). A trainer calls it once, from its flags:
//
//   tp::check_composition(tp::Composition().data(dp).pipeline(pp).tensor(t).zero(zero).sequence_parallel(sp));
//
// Supported: TP with DDP or ZeRO-1/2/3 over the data dimension, with a pipeline
// (DDP or ZeRO-1 over the data dimension), with sequence parallelism (but not with
// ZeRO-3), with bf16 autocast and activation checkpointing.
#include <torch/arg.h>

namespace cohort::tensor_parallel {

struct Composition {
  TORCH_ARG(int, data) = 1;
  TORCH_ARG(int, pipeline) = 1;
  TORCH_ARG(int, tensor) = 1;
  // Over the data dimension: 0 DDP (or nothing when data is 1); 1 and 2 ZeRO-1/2
  // (zero::ShardedOptimizer); 3 ZeRO-3 (zero::fully_shard).
  TORCH_ARG(int, zero) = 0;
  TORCH_ARG(bool, sequence_parallel) = false;
};

// ConfigError for a combination that is refused; returns otherwise.
void check_composition(const Composition& c);

}  // namespace cohort::tensor_parallel
