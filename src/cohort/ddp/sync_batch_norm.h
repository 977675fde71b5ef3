#pragma once
// Batch normalization whose training statistics span every rank of a group, so a
// small per-rank batch normalizes like the global batch would in one process. It
// stands in for torch::nn::BatchNorm{1,2,3}d (any input [N, C, *]) and keeps their
// parameter and buffer names, so state dicts interchange:
//
//   auto bn = cohort::ddp::SyncBatchNorm(
//       cohort::ddp::SyncBatchNormOptions(64).group(world.group()));
//
// or convert a model's BatchNorm layers before building the optimizer and DDP:
//
//   auto net = torch::nn::Sequential(conv, torch::nn::BatchNorm2d(64), relu);
//   cohort::ddp::convert_sync_batchnorm(net.ptr(), world.group());  // 1 layer
//
// In training mode every forward is a collective (one small all-reduce) and so is
// every backward (Note [Backward of the statistics all-reduce]): every rank of the
// group must run both, in the same order of layers. Eval mode uses the running
// statistics (or, without them, the local batch's) and never communicates.
//
// Caveat of convert_sync_batchnorm: LibTorch modules call their children through
// member fields, which replace_module cannot reach. Only layers held by a
// Sequential, ModuleList or ModuleDict can be swapped; a BatchNorm that a module
// holds in a field of its own is a ConfigError naming it, and you build that layer
// as SyncBatchNorm yourself (or hold it in a Sequential).
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <ostream>

#include "cohort/comm/group.h"

namespace cohort::ddp {

// The fields and defaults of torch::nn::BatchNormOptions, plus the group.
struct SyncBatchNormOptions {
  /* implicit */ SyncBatchNormOptions(std::int64_t num_features) : num_features_(num_features) {}

  TORCH_ARG(std::int64_t, num_features);
  TORCH_ARG(double, eps) = 1e-5;
  // Weight of the newest batch in the running statistics; nullopt averages all
  // batches so far equally (a cumulative moving average), as in PyTorch.
  TORCH_ARG(c10::optional<double>, momentum) = 0.1;
  TORCH_ARG(bool, affine) = true;
  TORCH_ARG(bool, track_running_stats) = true;
  // The ranks whose batches make up the statistics; needed in training mode.
  TORCH_ARG(comm::Group, group);
};

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(SyncBatchNormOptions options);

  void reset() override;
  void reset_running_stats();
  void reset_parameters();
  at::Tensor forward(const at::Tensor& input);
  void pretty_print(std::ostream& stream) const override;

  // Public, and named as in torch::nn::BatchNormImplBase.
  SyncBatchNormOptions options;
  at::Tensor weight;               // [C]; undefined unless affine
  at::Tensor bias;                 // [C]; undefined unless affine
  at::Tensor running_mean;         // [C]; undefined unless track_running_stats
  at::Tensor running_var;          // [C]; undefined unless track_running_stats
  at::Tensor num_batches_tracked;  // int64 scalar; undefined unless track_running_stats

 private:
  comm::Group checked_group() const;
  // Counts the batch; returns the weight of its statistics in the running ones.
  double advance_running_average();
  at::Tensor forward_synced(const at::Tensor& input, comm::Group& group);
};

TORCH_MODULE(SyncBatchNorm);

// Replaces every torch::nn::BatchNorm{1,2,3}d under `module` that sits in a
// Sequential, ModuleList or ModuleDict by a SyncBatchNorm over `group` with the same
// options, a copy of its parameters and buffers (requires_grad, device and dtype
// included) and the same train/eval mode. Returns how many layers it replaced.
// Throws ConfigError, changing nothing, when a BatchNorm is `module` itself or is
// held in a module's own field (see the caveat above). Parameters are new tensors:
// build the optimizer afterwards.
int convert_sync_batchnorm(const std::shared_ptr<torch::nn::Module>& module, const comm::Group& group);

}  // namespace cohort::ddp
