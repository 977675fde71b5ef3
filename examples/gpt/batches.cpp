#include "batches.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "cohort/errors.h"

namespace gpt {

namespace {

constexpr std::int64_t kStride = 1000003;

Batch rows(const std::vector<std::int32_t>& tokens, const std::vector<std::int64_t>& offsets, std::int64_t context) {
  auto inputs = torch::empty({static_cast<std::int64_t>(offsets.size()), context}, torch::kInt64);
  auto targets = torch::empty_like(inputs);
  auto in = inputs.accessor<std::int64_t, 2>();
  auto out = targets.accessor<std::int64_t, 2>();
  for (std::size_t r = 0; r < offsets.size(); ++r) {
    const auto* first = tokens.data() + offsets[r];
    for (std::int64_t c = 0; c < context; ++c) {
      in[static_cast<std::int64_t>(r)][c] = first[c];
      out[static_cast<std::int64_t>(r)][c] = first[c + 1];
    }
  }
  return {inputs, targets};
}

std::pair<std::int64_t, std::int64_t> share(std::int64_t batch_size, int replica, int replicas) {
  return {batch_size * replica / replicas, batch_size * (replica + 1) / replicas};
}

}  // namespace

std::int64_t window_offset(std::int64_t step, std::int64_t sample, std::int64_t batch_size, std::int64_t tokens,
                           std::int64_t context) {
  const auto span = static_cast<unsigned __int128>(tokens - context - 1);
  const auto index = static_cast<unsigned __int128>(step * batch_size + sample);
  return static_cast<std::int64_t>(index * kStride % span);
}

Batch training_batch(const std::vector<std::int32_t>& train, std::int64_t step, std::int64_t batch_size,
                     std::int64_t context, int replica, int replicas) {
  const auto n = static_cast<std::int64_t>(train.size());
  if (n < context + 2)
    throw cohort::ConfigError(fmt::format("gpt: the training stream has {} tokens, too few for a window of --context "
                                          "{} and its targets; use a smaller --context",
                                          n, context));
  const auto [first, last] = share(batch_size, replica, replicas);
  std::vector<std::int64_t> offsets;
  for (auto j = first; j < last; ++j) offsets.push_back(window_offset(step, j, batch_size, n, context));
  return rows(train, offsets, context);
}

Batch validation_batch(const std::vector<std::int32_t>& validation, std::int64_t index, std::int64_t batch_size,
                       std::int64_t context, int replica, int replicas) {
  const auto n = static_cast<std::int64_t>(validation.size());
  const auto windows = (n - 1) / context;
  if ((index + 1) * batch_size > windows)
    throw cohort::ConfigError(fmt::format("gpt: validation batch {} needs {} windows of {} tokens, but the validation "
                                          "stream of {} tokens holds {}; use a smaller --eval-batches, --batch-size "
                                          "or --context",
                                          index + 1, (index + 1) * batch_size, context, n, windows));
  const auto [first, last] = share(batch_size, replica, replicas);
  std::vector<std::int64_t> offsets;
  for (auto j = first; j < last; ++j) offsets.push_back((index * batch_size + j) * context);
  return rows(validation, offsets, context);
}

}  // namespace gpt
