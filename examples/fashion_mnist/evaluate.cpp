#include "evaluate.h"

#include <torch/nn/functional/loss.h>

#include <numeric>

namespace fashion_mnist {

Evaluation evaluate(FashionNet& model, cohort::data::FashionMnist& test, cohort::comm::Group& group,
                    c10::Device device) {
  constexpr std::size_t kBatch = 1000;
  const std::size_t n = test.size().value();
  const auto ranks = static_cast<std::size_t>(group.size());
  const auto rank = static_cast<std::size_t>(group.rank());
  const std::size_t begin = n * rank / ranks, end = n * (rank + 1) / ranks;

  torch::NoGradGuard no_grad;
  model->eval();
  double loss_sum = 0;
  std::int64_t correct = 0;
  for (std::size_t first = begin; first < end; first += kBatch) {
    std::vector<std::size_t> indices(std::min(kBatch, end - first));
    std::iota(indices.begin(), indices.end(), first);
    auto batch = test.get_batch(indices);
    auto logits = model->forward(batch.data.to(device));
    auto target = batch.target.to(device);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, target, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    correct += logits.argmax(1).eq(target).sum().item<std::int64_t>();
  }
  model->train();

  auto sums = torch::tensor({static_cast<double>(correct), static_cast<double>(end - begin), loss_sum},
                            torch::dtype(torch::kFloat64).device(device));
  group.all_reduce(sums);
  auto cpu = sums.cpu();
  return {static_cast<std::int64_t>(cpu[0].item<double>()), static_cast<std::int64_t>(cpu[1].item<double>()),
          cpu[2].item<double>()};
}

}  // namespace fashion_mnist
