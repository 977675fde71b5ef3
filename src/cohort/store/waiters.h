#pragma once
// Which parked requests (GET, WAIT, MULTI_GET) wait on which key, so that a write
// retries exactly the requests that name its key, not every parked one (Note [The
// loop's cost per wake-up] in store/server_loop.h). Pure bookkeeping: ids in,
// ids out; the server's loop owns the requests.
//
//   WaiterIndex waiters;
//   waiters.add(id, request.keys);
//   for (auto id : waiters.of("k")) ...;  // after a write to "k", in id order
//   waiters.remove(id, request.keys);
#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace cohort::store {

class WaiterIndex {
 public:
  // `id` waits on each of `keys` (a key named twice counts once).
  void add(std::uint64_t id, const std::vector<std::string>& keys);
  // The reverse of add, with the same keys.
  void remove(std::uint64_t id, const std::vector<std::string>& keys);
  bool has_waiters(const std::string& key) const { return by_key_.count(key) != 0; }
  // Those waiting on `key`, in id order (the loop's ids grow with accept order).
  std::vector<std::uint64_t> of(const std::string& key) const;
  // Keys with at least one waiter.
  std::size_t keys() const { return by_key_.size(); }

 private:
  std::unordered_map<std::string, std::set<std::uint64_t>> by_key_;
};

}  // namespace cohort::store
