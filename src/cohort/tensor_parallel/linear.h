#pragma once
// Linear layers split over a TP group, as Megatron-LM splits a transformer's MLP and
// attention (docs/tensor_parallel.md):
//
//   ColumnParallelLinear  weight [out/T, in]: each rank computes out/T of the outputs
//                         from the whole input (copy_to_tp before it);
//   RowParallelLinear     weight [out, in/T]: each rank takes in/T of the inputs and
//                         computes a partial sum of every output (reduce_from_tp after
//                         it, then the bias, which every rank holds whole).
//
// A column layer followed by a row layer with an elementwise function between them
// (the MLP; the attention's Q/K/V and output projections) costs one all-reduce in
// forward and one in backward. With sequence_parallel, the input of a column layer
// and the output of a row layer are sharded along the sequence (dimension 1 of
// [batch, sequence, features]): an all-gather replaces the copy and a reduce-scatter
// the all-reduce.
//
// Weights start as torch::nn::Linear's would from the same generator state, whole on
// every rank, and each rank keeps its slice: a TP model built after the same
// manual_seed as a one-process model holds the same numbers.
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include "cohort/comm/group.h"

namespace cohort::tensor_parallel {

// The dimension sequence parallelism shards: [batch, sequence, features].
constexpr std::int64_t kSequenceDim = 1;

struct ColumnParallelLinearOptions {
  ColumnParallelLinearOptions(std::int64_t in_features, std::int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(std::int64_t, in_features);
  // The whole layer's; each rank holds out_features / T of them.
  TORCH_ARG(std::int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
  // All-gather the outputs along the last dimension, so that every rank returns them
  // whole (the last layer before a loss that is not vocabulary-parallel).
  TORCH_ARG(bool, gather_output) = false;
  // The input arrives sharded along kSequenceDim and is all-gathered.
  TORCH_ARG(bool, sequence_parallel) = false;
  // The caller has already made the input whole on every rank with copy_to_tp (or,
  // under sequence parallelism, all_gather_from_tp), whose backward sums the ranks'
  // parts of its gradient: this layer applies neither. Several column layers reading
  // one input (attention's query, key and value) then share one collective in each
  // direction instead of one each.
  TORCH_ARG(bool, input_is_gathered) = false;
};

class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  ColumnParallelLinearImpl(comm::Group group, ColumnParallelLinearOptions options);
  at::Tensor forward(const at::Tensor& input);
  // Copies this rank's rows of a whole layer (its out_features x in_features weight).
  void load_whole(const torch::nn::Linear& whole);
  // This rank's [first, last) of the whole layer's outputs.
  std::int64_t first_output() const;
  std::int64_t last_output() const;
  const comm::Group& group() const { return group_; }
  void pretty_print(std::ostream& stream) const override;

  ColumnParallelLinearOptions options;
  at::Tensor weight;  // [out_features / T, in_features]
  at::Tensor bias;    // [out_features / T], undefined without bias

 private:
  comm::Group group_;
};
TORCH_MODULE(ColumnParallelLinear);

struct RowParallelLinearOptions {
  RowParallelLinearOptions(std::int64_t in_features, std::int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  // The whole layer's; each rank takes in_features / T of them.
  TORCH_ARG(std::int64_t, in_features);
  TORCH_ARG(std::int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
  // The input is already this rank's slice of the features (a column layer's output);
  // false: the whole input arrives and each rank takes its slice.
  TORCH_ARG(bool, input_is_parallel) = true;
  // Reduce-scatter the output along kSequenceDim instead of all-reducing it. Then the
  // bias's gradient on each rank is its sequence shard's: sum it over the group
  // after backward (sequence_parallel_gradients in sequence_parallel.h).
  TORCH_ARG(bool, sequence_parallel) = false;
};

class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(comm::Group group, RowParallelLinearOptions options);
  at::Tensor forward(const at::Tensor& input);
  // Copies this rank's columns of a whole layer, and its whole bias.
  void load_whole(const torch::nn::Linear& whole);
  std::int64_t first_input() const;
  std::int64_t last_input() const;
  const comm::Group& group() const { return group_; }
  void pretty_print(std::ostream& stream) const override;

  RowParallelLinearOptions options;
  at::Tensor weight;  // [out_features, in_features / T]
  at::Tensor bias;    // [out_features], the same on every rank

 private:
  comm::Group group_;
};
TORCH_MODULE(RowParallelLinear);

}  // namespace cohort::tensor_parallel
