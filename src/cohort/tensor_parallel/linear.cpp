#include "cohort/tensor_parallel/linear.h"

#include <fmt/format.h>
#include <torch/nn/functional/linear.h>
#include <torch/torch.h>

#include <ostream>
#include <utility>

#include "cohort/errors.h"
#include "cohort/tensor_parallel/collectives.h"

namespace cohort::tensor_parallel {
namespace {

// The share of `features` one rank of `group` holds; refuses what does not divide.
std::int64_t share(const char* who, const char* what, std::int64_t features, const comm::Group& group) {
  if (!group.is_member())
    throw ConfigError(fmt::format("cohort {}: this rank is not a member of the TP group it was given; pass a group "
                                  "this rank belongs to",
                                  who));
  if (features < 1 || features % group.size() != 0)
    throw ConfigError(fmt::format("cohort {}: {} is {}, which the {} ranks of TP group '{}' cannot split evenly; make "
                                  "it a positive multiple of the TP size",
                                  who, what, features, group.size(), group.name()));
  return features / group.size();
}

// Note [Whole, then sliced]
// Each rank draws the whole layer as torch::nn::Linear would, from the current
// generator, and keeps its slice. Every rank holds the same generator state (the
// same manual_seed, the same modules built before), so the slices fit together into
// exactly the layer a one-process model built from that seed holds, and the
// generator ends where that model's would: the layers after this one draw the same
// numbers too. The cost is the whole layer's memory for a moment, at construction.
torch::nn::Linear whole_layer(std::int64_t in, std::int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

void check_shape(const char* who, const torch::nn::Linear& whole, std::int64_t in, std::int64_t out, bool bias) {
  const auto& o = whole->options;
  if (o.in_features() != in || o.out_features() != out || o.bias() != bias)
    throw ConfigError(fmt::format("cohort {}::load_whole: the layer is Linear({}, {}, bias={}), but this one splits "
                                  "Linear({}, {}, bias={}); pass the layer this one was built from",
                                  who, o.in_features(), o.out_features(), o.bias(), in, out, bias));
}

}  // namespace

ColumnParallelLinearImpl::ColumnParallelLinearImpl(comm::Group group, ColumnParallelLinearOptions options_)
    : options(std::move(options_)), group_(std::move(group)) {
  share("ColumnParallelLinear", "out_features", options.out_features(), group_);
  auto whole = whole_layer(options.in_features(), options.out_features(), options.bias());
  weight = register_parameter("weight", whole->weight.detach().slice(0, first_output(), last_output()).clone());
  if (options.bias())
    bias = register_parameter("bias", whole->bias.detach().slice(0, first_output(), last_output()).clone());
}

std::int64_t ColumnParallelLinearImpl::first_output() const {
  return group_.rank() * (options.out_features() / group_.size());
}
std::int64_t ColumnParallelLinearImpl::last_output() const {
  return first_output() + options.out_features() / group_.size();
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& input) {
  auto x = options.input_is_gathered()   ? input
           : options.sequence_parallel() ? all_gather_from_tp(input, group_, kSequenceDim)
                                         : copy_to_tp(input, group_);
  auto y = torch::nn::functional::linear(x, weight, bias);
  return options.gather_output() ? gather_from_tp(y, group_, -1) : y;
}

void ColumnParallelLinearImpl::load_whole(const torch::nn::Linear& whole) {
  check_shape("ColumnParallelLinear", whole, options.in_features(), options.out_features(), options.bias());
  torch::NoGradGuard no_grad;
  weight.copy_(whole->weight.slice(0, first_output(), last_output()));
  if (options.bias()) bias.copy_(whole->bias.slice(0, first_output(), last_output()));
}

void ColumnParallelLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "cohort::tensor_parallel::ColumnParallelLinear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << " (" << last_output() - first_output()
         << " on this rank of " << group_.size() << "), bias=" << std::boolalpha << options.bias()
         << ", gather_output=" << options.gather_output() << ", sequence_parallel=" << options.sequence_parallel()
         << ", input_is_gathered=" << options.input_is_gathered() << ")";
}

RowParallelLinearImpl::RowParallelLinearImpl(comm::Group group, RowParallelLinearOptions options_)
    : options(std::move(options_)), group_(std::move(group)) {
  share("RowParallelLinear", "in_features", options.in_features(), group_);
  auto whole = whole_layer(options.in_features(), options.out_features(), options.bias());
  weight = register_parameter("weight", whole->weight.detach().slice(1, first_input(), last_input()).clone());
  if (options.bias()) bias = register_parameter("bias", whole->bias.detach().clone());
}

std::int64_t RowParallelLinearImpl::first_input() const {
  return group_.rank() * (options.in_features() / group_.size());
}
std::int64_t RowParallelLinearImpl::last_input() const { return first_input() + options.in_features() / group_.size(); }

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& input) {
  auto x = options.input_is_parallel() ? input : scatter_to_tp(input, group_, -1);
  if (x.size(-1) != weight.size(1))
    throw ConfigError(fmt::format("cohort RowParallelLinear (rank {} of TP group '{}'): the input's last dimension is "
                                  "{}, but this rank's slice of the {} input features is {}; {}",
                                  group_.rank(), group_.name(), x.size(-1), options.in_features(), weight.size(1),
                                  options.input_is_parallel()
                                      ? "feed it a ColumnParallelLinear's output, or set input_is_parallel(false) "
                                        "to pass the whole input"
                                      : "pass the whole input"));
  // The bias is added once, after the partial sums are combined.
  auto partial = torch::nn::functional::linear(x, weight);
  auto y = options.sequence_parallel() ? reduce_scatter_to_tp(partial, group_, kSequenceDim)
                                       : reduce_from_tp(partial, group_);
  return options.bias() ? y + bias : y;
}

void RowParallelLinearImpl::load_whole(const torch::nn::Linear& whole) {
  check_shape("RowParallelLinear", whole, options.in_features(), options.out_features(), options.bias());
  torch::NoGradGuard no_grad;
  weight.copy_(whole->weight.slice(1, first_input(), last_input()));
  if (options.bias()) bias.copy_(whole->bias);
}

void RowParallelLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "cohort::tensor_parallel::RowParallelLinear(in_features=" << options.in_features() << " ("
         << last_input() - first_input() << " on this rank of " << group_.size()
         << "), out_features=" << options.out_features() << ", bias=" << std::boolalpha << options.bias()
         << ", input_is_parallel=" << options.input_is_parallel()
         << ", sequence_parallel=" << options.sequence_parallel() << ")";
}

}  // namespace cohort::tensor_parallel
