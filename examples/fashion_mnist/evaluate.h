#pragma once
// Distributed evaluation: each rank scores its own slice of the test set, and the
// counts are summed over the group, so every rank gets the accuracy of the whole set.
#include <cstdint>

#include "cohort/comm/group.h"
#include "cohort/data/fashion_mnist.h"
#include "model.h"

namespace fashion_mnist {

struct Evaluation {
  std::int64_t correct = 0;
  std::int64_t total = 0;
  double loss_sum = 0;
  double accuracy() const { return total > 0 ? static_cast<double>(correct) / total : 0.0; }
  double loss() const { return total > 0 ? loss_sum / total : 0.0; }
};

// Collective over `group`. Rank r scores the r-th of group.size() contiguous slices,
// which together hold every test image exactly once (no padding).
Evaluation evaluate(FashionNet& model, cohort::data::FashionMnist& test, cohort::comm::Group& group,
                    c10::Device device);

}  // namespace fashion_mnist
