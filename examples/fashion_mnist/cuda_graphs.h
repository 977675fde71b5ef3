#pragma once
// --cuda-graphs: the trainer's whole step (zero_grad, forward and backward through
// DDP, the fused optimizer step) captured once into a CUDA graph and replayed
// (cohort::cuda_graphs::CapturedStep; docs/cuda_graphs.md).
//
// Note [What a captured step composes with]
// Plain DDP (--zero 0, one stage, one replica per process) over NCCL, with --amp
// bf16 or off, the fused optimizers, channels-last or not, any --schedule (the
// learning rate is a device tensor) and checkpoints (the optimizer's host step
// counts are kept right). Refused in options.cpp, each with its reason: the CPU,
// --fault-tolerance, pipelines, --data-parallel-replicas, ZeRO, --amp fp16 (its
// scaler reads the host), comm hooks, activation checkpointing, and the for-loop and
// foreach optimizer kernels. The batch's shape must not change: each epoch's short
// last batch is skipped, as drop_last would (Note [Short last batch] in trainer.cpp).
#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <memory>

#include "cohort/cuda_graphs/captured_step.h"
#include "cohort/trace/step_profiler.h"
#include "mixed_precision.h"
#include "strategy.h"

namespace fashion_mnist {

class GraphedStep {
 public:
  // Throws ConfigError where the step cannot be captured, with the fix.
  // `stream`: the capture stream the strategy's DDP was built on (capture_stream).
  GraphedStep(Strategy& strategy, torch::optim::Optimizer& optimizer, MixedPrecision& precision, c10::Device device,
              c10::Stream stream);
  // One training step on this batch; returns its loss on the device, valid until the
  // next step. Every batch must have the first one's shape.
  at::Tensor step(const at::Tensor& data, const at::Tensor& target, cohort::trace::StepProfiler& profiler);
  bool captured() const { return captured_.captured(); }

 private:
  Strategy& strategy_;
  torch::optim::Optimizer& optimizer_;
  MixedPrecision& precision_;
  c10::Device device_;
  at::Tensor data_, target_;  // the static inputs the graph reads
  cohort::trace::StepProfiler* profiler_ = nullptr;  // the running step's, for its eager steps
  cohort::cuda_graphs::CapturedStep captured_;
};

}  // namespace fashion_mnist
