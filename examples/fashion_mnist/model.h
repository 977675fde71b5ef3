#pragma once
// The network: two 3x3 convolutions with max pooling, then two linear layers (the
// "2 conv + pooling" family of Fashion-MNIST's benchmark table). No BatchNorm, so
// world 2 with batch b computes exactly what world 1 with batch 2b computes.
//
// Its PyTorch twin, with the same parameter names (conv1.weight, ..., fc2.bias), is
// fashion_net.py beside this file: a saved state dict loads into it with
// load_state_dict(strict=True).
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "cohort/zero/fully_shard.h"

namespace fashion_mnist {

class FashionNetImpl : public torch::nn::Cloneable<FashionNetImpl> {
 public:
  static constexpr int kConv1 = 32, kConv2 = 64, kHidden = 128;
  FashionNetImpl();
  // Registers the layers (Cloneable: a clone, e.g. a DataParallel replica, calls it too).
  void reset() override;
  torch::Tensor forward(torch::Tensor x);
  // Floating-point operations of one training sample: the forward's multiply-adds
  // counted as 2 FLOPs each, and backward as twice the forward (the gradients of the
  // inputs and of the weights), the usual 3x rule. About 25 MFLOP.
  static double training_flops_per_sample();
  // Stores the convolutions' weights channels-last (NHWC) and feeds them NHWC input,
  // where oneDNN's kernels and max pooling are faster on the CPU (docs/performance.md).
  // The same parameters and values: state dicts are unchanged.
  void use_channels_last();
  // Recomputes the two convolution blocks in backward instead of keeping their
  // activations (cohort::recompute, --activation-checkpointing).
  void use_activation_checkpointing() { recompute_ = true; }
  // --zero 3: each layer becomes a cohort::zero::FullyShard unit, under the same
  // name (fully_sharded.cpp wraps the whole network and calls fully_shard()).
  void use_fully_shard_units();

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
  cohort::zero::FullyShard<torch::nn::Conv2dImpl> conv1_unit_{nullptr}, conv2_unit_{nullptr};
  cohort::zero::FullyShard<torch::nn::LinearImpl> fc1_unit_{nullptr}, fc2_unit_{nullptr};
  bool channels_last_ = false;
  bool recompute_ = false;
};
TORCH_MODULE(FashionNet);

}  // namespace fashion_mnist
