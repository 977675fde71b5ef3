#pragma once
// The store server's deadlines (a handshake's, a lingering close's, a parked
// request's), ordered by when they fall: each wake-up looks at the expired ones
// alone, and the loop sleeps until the nearest (Note [The loop's cost per wake-up]
// in store/server_loop.h). Each id holds at most one deadline; setting another
// replaces it.
//
//   DeadlineQueue q;
//   q.set(id, Clock::now() + 1s);
//   for (auto id : q.due(Clock::now())) ...;  // earliest first
#include <cstdint>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cohort/store/net.h"

namespace cohort::store {

class DeadlineQueue {
 public:
  void set(std::uint64_t id, net::Clock::time_point at);
  void clear(std::uint64_t id);
  // The nearest deadline, if any.
  std::optional<net::Clock::time_point> next() const;
  // The ids whose deadline is at or before `now`, earliest first (ties by id). They
  // stay queued: the caller acts on each and then sets or clears its deadline.
  std::vector<std::uint64_t> due(net::Clock::time_point now) const;
  std::size_t size() const { return at_.size(); }

 private:
  std::set<std::pair<net::Clock::time_point, std::uint64_t>> order_;
  std::unordered_map<std::uint64_t, net::Clock::time_point> at_;
};

}  // namespace cohort::store
