#include "cohort/store/store_ops.h"

namespace cohort::store {

namespace {
// Note [A look in one call]
// A check() followed by a get() is two round trips, and a protocol that reads a key
// per rank pays them N times on its critical path. compareSet with an expected
// value that no key ever holds writes nothing and answers with the value when the
// key is there, or with that expected value when it is not (c10d's rule, kept by
// cohort's store, TCPStore and HashStore): a look in one round trip, on every store.
const std::vector<std::uint8_t>& absent() {
  static const std::vector<std::uint8_t> marker = [] {
    const std::string text = "\x01cohort: no such key\x01";
    return std::vector<std::uint8_t>(text.begin(), text.end());
  }();
  return marker;
}
}  // namespace

std::optional<std::vector<std::uint8_t>> look(c10d::Store& store, const std::string& key) {
  auto value = store.compareSet(key, absent(), absent());
  if (value == absent()) return std::nullopt;
  return value;
}

void append_bytes(c10d::Store& store, const std::string& key, const std::vector<std::uint8_t>& bytes) {
  std::vector<std::uint8_t> seen;
  if (auto now = look(store, key)) seen = std::move(*now);
  while (true) {
    auto desired = seen;
    desired.insert(desired.end(), bytes.begin(), bytes.end());
    auto now_there = store.compareSet(key, seen, desired);
    if (now_there == desired) return;
    seen = std::move(now_there);
  }
}

}  // namespace cohort::store
