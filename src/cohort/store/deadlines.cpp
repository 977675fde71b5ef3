#include "cohort/store/deadlines.h"

namespace cohort::store {

void DeadlineQueue::set(std::uint64_t id, net::Clock::time_point at) {
  auto [it, inserted] = at_.try_emplace(id, at);
  if (!inserted) {
    if (it->second == at) return;
    order_.erase({it->second, id});
    it->second = at;
  }
  order_.insert({at, id});
}

void DeadlineQueue::clear(std::uint64_t id) {
  auto it = at_.find(id);
  if (it == at_.end()) return;
  order_.erase({it->second, id});
  at_.erase(it);
}

std::optional<net::Clock::time_point> DeadlineQueue::next() const {
  if (order_.empty()) return std::nullopt;
  return order_.begin()->first;
}

std::vector<std::uint64_t> DeadlineQueue::due(net::Clock::time_point now) const {
  std::vector<std::uint64_t> out;
  for (auto it = order_.begin(); it != order_.end() && it->first <= now; ++it) out.push_back(it->second);
  return out;
}

}  // namespace cohort::store
