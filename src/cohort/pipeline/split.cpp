#include "cohort/pipeline/split.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "cohort/errors.h"

namespace cohort::pipeline {

namespace {

std::vector<std::string> layer_names(const torch::nn::Sequential& model) {
  std::vector<std::string> names;
  for (const auto& item : model->named_children()) names.push_back(item.key());
  return names;
}

std::int64_t parameter_count(const torch::nn::Module& m) {
  std::int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace

std::vector<torch::nn::Sequential> split_by_balance(const torch::nn::Sequential& model,
                                                    const std::vector<int>& balance) {
  const auto names = layer_names(model);
  const auto layers = static_cast<int>(model->size());
  const int total = std::accumulate(balance.begin(), balance.end(), 0);
  const bool positive = std::all_of(balance.begin(), balance.end(), [](int b) { return b > 0; });
  if (balance.empty() || !positive || total != layers)
    throw ConfigError(fmt::format("cohort pipeline: the balance [{}] must list a positive layer count per stage "
                                  "adding up to the model's {} layers; got a sum of {}",
                                  fmt::join(balance, ", "), layers, total));
  std::vector<torch::nn::Sequential> parts;
  std::size_t next = 0;
  for (int count : balance) {
    torch::nn::Sequential part;
    for (int k = 0; k < count; ++k, ++next) part->push_back(names[next], *(model->begin() + static_cast<std::ptrdiff_t>(next)));
    parts.push_back(part);
  }
  return parts;
}

std::vector<int> balance_by_parameters(const torch::nn::Sequential& model, int stages) {
  const auto layers = static_cast<int>(model->size());
  if (stages < 1 || stages > layers)
    throw ConfigError(fmt::format("cohort pipeline: cannot cut {} layers into {} stages; use 1 to {} stages",
                                  layers, stages, layers));
  std::vector<std::int64_t> counts;
  for (const auto& child : model->children()) counts.push_back(parameter_count(*child));
  // Linear partition by dynamic programming: best[k][i] is the smallest possible
  // largest part when the first i layers form k parts.
  const std::int64_t inf = std::numeric_limits<std::int64_t>::max();
  std::vector<std::int64_t> prefix(layers + 1, 0);
  for (int i = 0; i < layers; ++i) prefix[i + 1] = prefix[i] + counts[i];
  std::vector<std::vector<std::int64_t>> best(stages + 1, std::vector<std::int64_t>(layers + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(layers + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k)
    for (int i = k; i <= layers; ++i)
      for (int j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == inf) continue;
        const auto worst = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (worst < best[k][i]) {
          best[k][i] = worst;
          cut[k][i] = j;
        }
      }
  std::vector<int> balance(stages);
  for (int k = stages, i = layers; k > 0; --k) {
    balance[k - 1] = i - cut[k][i];
    i = cut[k][i];
  }
  return balance;
}

std::vector<torch::nn::Sequential> split_by_parameters(const torch::nn::Sequential& model, int stages) {
  return split_by_balance(model, balance_by_parameters(model, stages));
}

std::vector<torch::nn::Sequential> split_at(const torch::nn::Sequential& model,
                                            const std::vector<std::string>& split_points) {
  const auto names = layer_names(model);
  std::vector<int> balance;
  int start = 0;
  for (const auto& point : split_points) {
    auto it = std::find(names.begin(), names.end(), point);
    if (it == names.end())
      throw ConfigError(fmt::format("cohort pipeline: split point '{}' is not a layer of the model; its layers are "
                                    "[{}]",
                                    point, fmt::join(names, ", ")));
    const int at = static_cast<int>(it - names.begin());
    if (at <= start)
      throw ConfigError(fmt::format("cohort pipeline: split point '{}' (layer {}) does not come after the previous "
                                    "stage's start (layer {}); list split points in model order, excluding the "
                                    "first layer",
                                    point, at, start));
    balance.push_back(at - start);
    start = at;
  }
  balance.push_back(static_cast<int>(names.size()) - start);
  return split_by_balance(model, balance);
}

}  // namespace cohort::pipeline
