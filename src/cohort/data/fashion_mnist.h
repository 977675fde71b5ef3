#pragma once
// Fashion-MNIST (Zalando's 28x28 grey images of clothes in 10 classes) as a LibTorch
// batch dataset, read from the gzipped IDX files that Debian's dataset-fashion-mnist
// installs in /usr/share/datasets/fashion-mnist.
//
//   cohort::data::FashionMnist train(dir, cohort::data::FashionMnist::Split::kTrain);
//   auto loader = torch::data::make_data_loader(train, sampler, batch_size);
//   for (auto& batch : *loader) { batch.data;  /* [B,1,28,28] float */ batch.target; }
//
// The images stay in memory as bytes (47 MB for the training set) and are turned into
// normalised floats one batch at a time, so a worker's memory stays small.
#include <torch/data/datasets/base.h>
#include <torch/data/example.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace cohort::data {

class FashionMnist
    : public torch::data::datasets::BatchDataset<FashionMnist, torch::data::Example<>,
                                                 std::vector<std::size_t>> {
 public:
  enum class Split { kTrain, kTest };
  static constexpr const char* kDefaultDirectory = "/usr/share/datasets/fashion-mnist";
  static constexpr int kClasses = 10;
  // The training set's pixel mean and standard deviation, after scaling to [0, 1].
  static constexpr double kMean = 0.2860;
  static constexpr double kStd = 0.3530;

  // Reads `<directory>/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`. Throws
  // cohort::DataError when a file is missing, truncated or corrupt, or when images
  // and labels do not match.
  FashionMnist(const std::string& directory, Split split);

  // Images as [B, 1, 28, 28] floats, normalised with kMean and kStd; labels as int64.
  torch::data::Example<> get_batch(std::vector<std::size_t> indices) override;
  c10::optional<std::size_t> size() const override;

  const torch::Tensor& images() const { return images_; }  // [N, 28, 28] uint8
  const torch::Tensor& labels() const { return labels_; }  // [N] int64
  static const char* class_name(int label);

 private:
  torch::Tensor images_;
  torch::Tensor labels_;
};

}  // namespace cohort::data
