#include "cohort/store/waiters.h"

namespace cohort::store {

void WaiterIndex::add(std::uint64_t id, const std::vector<std::string>& keys) {
  for (const auto& key : keys) by_key_[key].insert(id);
}

void WaiterIndex::remove(std::uint64_t id, const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    auto it = by_key_.find(key);
    if (it == by_key_.end()) continue;
    it->second.erase(id);
    if (it->second.empty()) by_key_.erase(it);
  }
}

std::vector<std::uint64_t> WaiterIndex::of(const std::string& key) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return {};
  return {it->second.begin(), it->second.end()};
}

}  // namespace cohort::store
