#pragma once
// The store server's keys and values, and what each request does to them, with the
// semantics of c10d's TCPStore and HashStore. No sockets and no clocks: the server
// parks a request that cannot complete yet and retries it after a write.
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cohort/store/wire.h"

namespace cohort::store {

class Table {
 public:
  // The reply to `request`, or nullopt when it waits for keys that do not exist yet
  // (GET, WAIT and MULTI_GET).
  std::optional<Reply> apply(const Request& request);

  // Those of `keys` that do not exist, in order.
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;

  // Grows with every write, so a caller can tell whether parked requests may now complete.
  std::uint64_t generation() const { return generation_; }

 private:
  std::unordered_map<std::string, Bytes> map_;
  std::uint64_t generation_ = 0;
};

}  // namespace cohort::store
