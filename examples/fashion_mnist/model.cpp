#include "model.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>

#include "cohort/recompute/checkpoint.h"

namespace fashion_mnist {

FashionNetImpl::FashionNetImpl() { reset(); }

void FashionNetImpl::reset() {
  conv1_ = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, kConv1, 3).padding(1)));
  conv2_ = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(kConv1, kConv2, 3).padding(1)));
  fc1_ = register_module("fc1", torch::nn::Linear(kConv2 * 7 * 7, kHidden));
  fc2_ = register_module("fc2", torch::nn::Linear(kHidden, 10));
}

double FashionNetImpl::training_flops_per_sample() {
  const double conv1 = 28.0 * 28 * kConv1 * (1 * 3 * 3);  // multiply-adds per sample
  const double conv2 = 14.0 * 14 * kConv2 * (kConv1 * 3 * 3);
  const double fc = kConv2 * 7.0 * 7 * kHidden + kHidden * 10.0;
  return 3 * 2 * (conv1 + conv2 + fc);
}

void FashionNetImpl::use_channels_last() {
  torch::NoGradGuard no_grad;
  // Note [Channels-last with one channel]: contiguous(ChannelsLast) returns conv1's
  // [32, 1, 3, 3] weight unchanged, since with one input channel both layouts hold
  // the same bytes; but oneDNN picks its kernel's layout from the strides, and
  // those still say NCHW. A copy made channels-last gets NHWC strides.
  for (auto* conv : {&conv1_, &conv2_}) {
    auto& w = (*conv)->weight;
    w.set_data(w.data().to(w.options(), /*non_blocking=*/false, /*copy=*/true, torch::MemoryFormat::ChannelsLast));
  }
  channels_last_ = true;
}

namespace {
// The layer registered as `name` becomes a unit under the same name.
template <typename Impl>
cohort::zero::FullyShard<Impl> unit(torch::nn::Module& net, const std::string& name,
                                    const torch::nn::ModuleHolder<Impl>& layer) {
  cohort::zero::FullyShard<Impl> u(layer);
  net.replace_module(name, u.ptr());
  return u;
}
}  // namespace

void FashionNetImpl::use_fully_shard_units() {
  conv1_unit_ = unit(*this, "conv1", conv1_);
  conv2_unit_ = unit(*this, "conv2", conv2_);
  fc1_unit_ = unit(*this, "fc1", fc1_);
  fc2_unit_ = unit(*this, "fc2", fc2_);
}

// Note [Pool, then ReLU]: max pooling and ReLU commute exactly (both pick or clamp
// values, neither rounds), and so do their gradients, so pooling first computes the
// same network with ReLU and its backward on a quarter of the elements.
torch::Tensor FashionNetImpl::forward(torch::Tensor x) {
  if (channels_last_) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
  // Captures `this` only: recomputation calls it again in backward, after this
  // forward has returned.
  auto convolutions = [this](const cohort::recompute::TensorList& in) {
    auto h = torch::relu(torch::max_pool2d(conv1_unit_ ? conv1_unit_(in[0]) : conv1_(in[0]), 2));
    return cohort::recompute::TensorList{
        torch::relu(torch::max_pool2d(conv2_unit_ ? conv2_unit_(h) : conv2_(h), 2))};
  };
  // A fully sharded unit's parameters exist only inside it, so under --zero 3 the
  // segment is checkpointed without .modules() (docs/zero.md, Composing).
  auto options = conv1_unit_ ? cohort::recompute::CheckpointOptions()
                             : cohort::recompute::CheckpointOptions().modules({conv1_.ptr(), conv2_.ptr()});
  x = recompute_ ? cohort::recompute::checkpoint(convolutions, {x}, options)[0] : convolutions({x})[0];
  x = torch::relu(fc1_unit_ ? fc1_unit_(x.flatten(1)) : fc1_(x.flatten(1)));
  return fc2_unit_ ? fc2_unit_(x) : fc2_(x);
}

}  // namespace fashion_mnist
