#pragma once
// Checkpoints of a model with tensor-parallel layers: how each of its parameters is
// split, for Checkpointer (checkpoint/split_state.h). Saved whole, loaded at any TP
// size (Note [Checkpoints hold whole tensors]):
//
//   namespace tp = cohort::tensor_parallel;
//   cohort::checkpoint::Checkpointer ckpt(dir, world.group(),
//       cohort::checkpoint::CheckpointerOptions().split_parameters(tp::parameter_splits));
//
// model.pt is then the one-process model's state dict: the TP layers use
// torch::nn::Linear's and torch::nn::Embedding's parameter names.
#include <torch/nn/module.h>

#include <vector>

#include "cohort/checkpoint/split_state.h"

namespace cohort::tensor_parallel {

// The split parameters of `model`, by their names in model.named_parameters():
//   ColumnParallelLinear   weight and bias along dimension 0 (outputs);
//   RowParallelLinear      weight along dimension 1 (inputs); its bias is whole;
//   VocabParallelEmbedding weight along dimension 0 (vocabulary);
// each over the layer's TP group. Everything else is replicated
// (replicated_parameters in block.h) and saved as it is.
std::vector<checkpoint::ParameterSplit> parameter_splits(const torch::nn::Module& model);

}  // namespace cohort::tensor_parallel
