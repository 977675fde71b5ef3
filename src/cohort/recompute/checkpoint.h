#pragma once
// Activation checkpointing: trade compute for memory. A checkpointed segment's
// forward keeps none of its intermediate activations, only its inputs; backward runs
// the segment's forward again, with gradients, and differentiates that. The C++ form
// of torch.utils.checkpoint (pytorch#52744).
//
//   using cohort::recompute::checkpoint;
//   auto h = checkpoint([&](const TensorList& in) { return TensorList{block->forward(in[0])}; }, {x},
//                       cohort::recompute::CheckpointOptions().modules({block}))[0];
//   auto y = cohort::recompute::checkpoint_sequential(model, /*segments=*/4, x);  // a whole Sequential
//
// Note [Recomputing exactly]
// The recomputation must redo what the forward did, bit for bit:
//  * the random generators (CPU, and the inputs' CUDA device) are restored to their
//    state before the forward, so dropout draws the same masks, and put back after
//    (in a CPU DataParallel replica the CPU generator is the replica's own during its
//    forward: Note [One CPU generator per replica] in dp/data_parallel.h);
//  * autocast is set as it was during the forward (enabled flag and dtype, CPU and
//    CUDA), whatever it is during backward;
//  * modules' buffers (BatchNorm's running statistics and batch counter) are restored
//    after the recomputation, so they are updated once per step, not twice
//    (pytorch#96136). This needs the modules: checkpoint_sequential knows them; pass
//    them to checkpoint() with .modules(...).
//
// Note [Parameters as inputs]
// The segment's parameters become inputs of its autograd node, and backward returns
// their gradients to autograd's engine, which accumulates them as without
// checkpointing: each gradient arrives once, through the parameter's own
// accumulator, where DDP's hooks wait, and DDP's search for unused parameters finds
// them behind the node (pytorch#24005). With no modules given, backward differentiates
// the recomputed graph into the parameters' .grad itself (PyTorch's reentrant
// variant): fine under DDP without find_unused_parameters.
#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <memory>
#include <vector>

namespace cohort::recompute {

using TensorList = std::vector<at::Tensor>;
using SegmentFn = std::function<TensorList(const TensorList&)>;

struct CheckpointOptions {
  // Restore the random generators before recomputing (Note [Recomputing exactly]).
  TORCH_ARG(bool, preserve_rng_state) = true;
  // The modules the function runs: their parameters get gradients as inputs of the
  // segment (Note [Parameters as inputs]) and their buffers are kept from being
  // updated twice.
  TORCH_ARG(std::vector<std::shared_ptr<torch::nn::Module>>, modules) = {};
};

// Runs fn(inputs) without keeping its activations; backward recomputes them. The
// outputs are floating-point tensors (or undefined). Under no_grad, or when nothing
// requires a gradient, it is fn(inputs).
TensorList checkpoint(SegmentFn fn, const TensorList& inputs, CheckpointOptions options = CheckpointOptions());

// `model` cut into `segments` consecutive runs of modules, each checkpointed but the
// last (its activations are needed by the backward at once), as PyTorch's
// checkpoint_sequential. ConfigError when segments is below 1 or above the modules.
at::Tensor checkpoint_sequential(const torch::nn::Sequential& model, int segments, const at::Tensor& input,
                                 CheckpointOptions options = CheckpointOptions());

}  // namespace cohort::recompute
