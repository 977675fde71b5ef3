#include "model.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>

namespace fashion_mnist {

FashionNetImpl::FashionNetImpl()
    : conv1_(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, kConv1, 3).padding(1)))),
      conv2_(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(kConv1, kConv2, 3).padding(1)))),
      fc1_(register_module("fc1", torch::nn::Linear(kConv2 * 7 * 7, kHidden))),
      fc2_(register_module("fc2", torch::nn::Linear(kHidden, 10))) {}

torch::Tensor FashionNetImpl::forward(torch::Tensor x) {
  x = torch::max_pool2d(torch::relu(conv1_(x)), 2);
  x = torch::max_pool2d(torch::relu(conv2_(x)), 2);
  return fc2_(torch::relu(fc1_(x.flatten(1))));
}

}  // namespace fashion_mnist
