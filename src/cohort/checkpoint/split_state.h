#pragma once
// Checkpoints of a model whose parameters are split over a group of ranks (tensor
// parallelism: each rank holds one equal chunk of a layer's weight). The checkpoint
// holds every such parameter whole, and its optimizer state whole too, so that
// model.pt is the one-process state dict and any split size can load it
// (Note [Checkpoints hold whole tensors]).
//
//   Checkpointer ckpt(dir, world.group(),
//       CheckpointerOptions().split_parameters(cohort::tensor_parallel::parameter_splits));
//
// The layers that split (tensor_parallel/) say how; this folder only gathers and
// slices. The functions below are what Checkpointer calls; a program that writes a
// state dict itself can call them too.
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cohort/comm/group.h"

namespace cohort::checkpoint {

// Parameter `name` (dotted, as in named_parameters()) of the model: this rank holds
// chunk group.rank() of group.size() equal chunks of the whole along `dim`.
struct ParameterSplit {
  std::string name;
  std::int64_t dim = 0;
  comm::Group group;
};
// Finds a model's split parameters (tensor_parallel::parameter_splits).
using SplitsOf = std::function<std::vector<ParameterSplit>(const torch::nn::Module&)>;

// Collective over each split's group: the module's state dict (as state_dict()) with
// each split parameter gathered whole. Every rank gets it.
c10::Dict<std::string, at::Tensor> whole_state_dict(const torch::nn::Module& module,
                                                    const std::vector<ParameterSplit>& splits);

// Replaces, in a whole state dict loaded from `source`, each split parameter by this
// rank's chunk. A whole tensor that the split's group cannot cut into the model's
// chunk is a cohort::ConfigError naming the key, both shapes and the group.
c10::impl::GenericDict slice_state_dict(const c10::impl::GenericDict& whole, const torch::nn::Module& module,
                                        const std::vector<ParameterSplit>& splits, const std::string& source);

// While alive, the optimizer's state of each split parameter is whole on this rank:
// its tensors of the parameter's shape (Adam's moments, SGD's momentum) gathered
// over the split's group. Collective at construction; the destructor puts the
// slices back. Optimizers other than SGD, Adam, AdamW, RMSprop and Adagrad are
// refused with a cohort::ConfigError (which of their tensors split is unknown).
class WholeOptimizerState {
 public:
  WholeOptimizerState(const torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                      const std::vector<ParameterSplit>& splits);
  ~WholeOptimizerState();
  WholeOptimizerState(const WholeOptimizerState&) = delete;
  WholeOptimizerState& operator=(const WholeOptimizerState&) = delete;

 private:
  std::vector<std::pair<at::Tensor*, at::Tensor>> slices_;  // (the field, the slice it held)
};

// After the optimizer loaded a whole state: keeps this rank's chunk of each split
// parameter's state tensors. Throws cohort::ConfigError naming the parameter when a
// tensor does not cut into it; the optimizer is left unchanged then.
void slice_optimizer_state(torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                           const std::vector<ParameterSplit>& splits, const std::string& source);

}  // namespace cohort::checkpoint
