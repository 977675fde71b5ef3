#pragma once
// The network: two 3x3 convolutions with max pooling, then two linear layers (the
// "2 conv + pooling" family of Fashion-MNIST's benchmark table). No BatchNorm, so
// world 2 with batch b computes exactly what world 1 with batch 2b computes.
//
// The parameter names (conv1.weight, ..., fc2.bias) are those of this PyTorch module,
// so a saved state dict loads into it with load_state_dict:
//
//   class FashionNet(nn.Module):
//       def __init__(self):
//           super().__init__()
//           self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
//           self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
//           self.fc1 = nn.Linear(64 * 7 * 7, 128)
//           self.fc2 = nn.Linear(128, 10)
//       def forward(self, x):
//           x = F.max_pool2d(F.relu(self.conv1(x)), 2)
//           x = F.max_pool2d(F.relu(self.conv2(x)), 2)
//           return self.fc2(F.relu(self.fc1(x.flatten(1))))
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

namespace fashion_mnist {

class FashionNetImpl : public torch::nn::Module {
 public:
  static constexpr int kConv1 = 32, kConv2 = 64, kHidden = 128;
  FashionNetImpl();
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::nn::Conv2d conv1_, conv2_;
  torch::nn::Linear fc1_, fc2_;
};
TORCH_MODULE(FashionNet);

}  // namespace fashion_mnist
