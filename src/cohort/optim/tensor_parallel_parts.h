#pragma once
// The GradParts of a model with tensor-parallel layers, for clip_grad_norm_
// (optim/clip_grad_norm.h): the layers' slices sum over the TP group, what every TP
// rank holds whole is counted once.
#include <torch/nn/module.h>

#include <vector>

#include "cohort/comm/group.h"
#include "cohort/optim/clip_grad_norm.h"

namespace cohort::optim {

// Two parts: the slices of the TP layers (ColumnParallelLinear's weight and bias,
// RowParallelLinear's weight, VocabParallelEmbedding's table) summing over `tp` and
// `also`; every other parameter (replicated_parameters in tensor_parallel/block.h:
// LayerNorms, row-parallel biases) over `also` only. `also`: the pipeline group when
// each stage passes its own stage's model. Throws ConfigError when a TP layer of
// `model` is over a group of other ranks than `tp`'s.
std::vector<GradPart> tensor_parallel_parts(const torch::nn::Module& model, const comm::Group& tp,
                                            std::vector<comm::Group> also = {});

}  // namespace cohort::optim
