#include "cohort/zero/partition.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace cohort::zero {

std::vector<int> partition_by_size(const std::vector<std::int64_t>& bytes, int world_size) {
  if (world_size < 1) throw std::invalid_argument("partition_by_size: world_size must be at least 1");
  std::vector<std::size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return bytes[a] > bytes[b]; });
  std::vector<std::int64_t> load(static_cast<std::size_t>(world_size), 0);
  std::vector<int> owner(bytes.size(), 0);
  for (std::size_t i : order) {
    const auto lightest = std::min_element(load.begin(), load.end()) - load.begin();
    owner[i] = static_cast<int>(lightest);
    load[static_cast<std::size_t>(lightest)] += bytes[i];
  }
  return owner;
}

}  // namespace cohort::zero
