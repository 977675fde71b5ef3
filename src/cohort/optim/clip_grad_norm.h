#pragma once
// Gradient clipping by the global norm of a model split over processes: what
// torch::nn::utils::clip_grad_norm_ computes for the whole model in one process, when
// its parameters are sliced over a TP group, spread over pipeline stages, or sharded
// by fully_shard (docs/clipping.md). The caller says, for each set of parameters,
// which groups hold disjoint pieces of them; their norms are combined over those
// groups and no others (Note [Which groups a norm sums over]):
//
//   // optim/tensor_parallel_parts.h; or a list of GradPart for any split
//   auto parts = cohort::optim::tensor_parallel_parts(*model, mesh.group(MeshDim::kTensor),
//                                                    {mesh.group(MeshDim::kPipeline)});
//   loss.backward();  // and DDP's reduction, sum_replicated_gradients under SP
//   auto norm = cohort::optim::clip_grad_norm_(parts, cohort::optim::ClipGradNormOptions(1.0));
//   optimizer.step();
//
// fully_shard's shards are disjoint over its data-parallel group:
//
//   cohort::optim::clip_grad_norm_({{sharded.parameters(), {dp_group}}}, 1.0);
//
// Nothing waits on the device: the norm stays a tensor, and the gradients are scaled
// by min(1, max_norm / (norm + 1e-6)) as a tensor too.
#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <vector>

#include "cohort/comm/group.h"

namespace cohort::optim {

// Parameters whose gradients are disjoint pieces across the ranks of each group in
// `sum_over`: their squared norms (max norms, for inf) are summed (maxed) over those
// groups. Parameters every rank of a group holds whole (DDP replicas, a TP group's
// LayerNorms) must not name that group, or they count once per rank.
//
// `counted` false: the part's gradients are scaled with the others but left out of
// the norm, as a copy of a parameter whose gradient another part (or rank) already
// counts: a pipeline's last stage's copy of a tied embedding. Such a part takes part
// in no collective, so any rank may add one.
struct GradPart {
  GradPart(std::vector<at::Tensor> parameters, std::vector<comm::Group> sum_over = {}, bool counted = true)
      : parameters(std::move(parameters)), sum_over(std::move(sum_over)), counted(counted) {}
  std::vector<at::Tensor> parameters;
  std::vector<comm::Group> sum_over;
  bool counted = true;
};

struct ClipGradNormOptions {
  /* implicit */ ClipGradNormOptions(double max_norm) : max_norm_(max_norm) {}
  // > 0.
  TORCH_ARG(double, max_norm);
  // 2 or infinity (std::numeric_limits<double>::infinity()).
  TORCH_ARG(double, norm_type) = 2.0;
  // Throw when the norm is NaN or infinite, before scaling anything. It reads the norm
  // on the host: a device sync, as in PyTorch.
  TORCH_ARG(bool, error_if_nonfinite) = false;
};

// Collective over every group the parts name: every rank of such a group calls it
// with parts of the same shape (the same number, each naming its groups in the same
// order), even a rank with no gradients. Returns the whole model's norm, a 0-dim
// double tensor on the gradients' device, the same on every rank. Parameters
// without a gradient are skipped, as in PyTorch.
at::Tensor total_grad_norm(const std::vector<GradPart>& parts, double norm_type = 2.0);

// total_grad_norm, then every gradient times min(1, max_norm / (norm + 1e-6)).
// Returns the norm before clipping.
at::Tensor clip_grad_norm_(const std::vector<GradPart>& parts, ClipGradNormOptions options);

}  // namespace cohort::optim
