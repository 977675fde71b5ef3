#include "cohort/fault_tolerance/step_sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "cohort/errors.h"

namespace cohort::fault_tolerance {

StepSampler::StepSampler(StepSamplerOptions options) : options_(options) {
  if (options_.global_batch() < 1 || options_.global_batch() > options_.dataset_size())
    throw ConfigError(fmt::format("cohort: StepSampler: a global batch of {} does not fit a dataset of {} samples; "
                                  "give a batch between 1 and the dataset's size",
                                  options_.global_batch(), options_.dataset_size()));
  steps_per_epoch_ = options_.dataset_size() / options_.global_batch();
}

std::pair<std::int64_t, std::int64_t> StepSampler::part(int rank, int size) const {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "StepSampler: rank ", rank, " of ", size);
  const auto b = options_.global_batch();
  TORCH_CHECK(size <= b, "StepSampler: ", size, " replicas cannot split a global batch of ", b);
  const auto begin = b * rank / size;
  const auto end = b * (rank + 1) / size;
  return {begin, end};
}

std::vector<std::int64_t> StepSampler::indices(std::int64_t step, int rank, int size) {
  const auto epoch = epoch_of(step);
  if (epoch != cached_epoch_) {
    if (options_.shuffle()) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(options_.seed() + static_cast<std::uint64_t>(epoch));
      order_ = at::randperm(options_.dataset_size(), gen, at::kLong);
    } else {
      order_ = at::arange(options_.dataset_size(), at::kLong);
    }
    cached_epoch_ = epoch;
  }
  const auto [begin, end] = part(rank, size);
  const auto base = (step % steps_per_epoch_) * options_.global_batch();
  const auto* o = order_.data_ptr<std::int64_t>();
  return std::vector<std::int64_t>(o + base + begin, o + base + end);
}

double StepSampler::loss_weight(std::int64_t, int rank, int size) const {
  const auto [begin, end] = part(rank, size);
  return static_cast<double>(end - begin) * size / static_cast<double>(options_.global_batch());
}

}  // namespace cohort::fault_tolerance
