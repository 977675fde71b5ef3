#pragma once
// Two operations on any c10d::Store (cohort's, c10d's TCPStore, HashStore, under
// PrefixStores), made of compareSet alone, for protocols that must cost the store
// O(N) calls at N ranks (docs/scale.md):
//
//   if (auto text = cohort::store::look(store, key)) ...;      // one round trip
//   cohort::store::append_bytes(store, key, bytes);             // LibTorch 1.13 too
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cohort/compat/c10d.h"

namespace cohort::store {

// The value of `key` when it is there, in one round trip (Note [A look in one call]).
std::optional<std::vector<std::uint8_t>> look(c10d::Store& store, const std::string& key);

// Appends `bytes` to `key` (creating it), atomically with respect to every other
// append_bytes whose bytes differ from its own (an append tells that it landed by
// the value it wrote: give each one a part no other has, a rank or a name): a compareSet that loses a race retries on the value it lost to, so
// k concurrent appends to one key cost about k^2 / 2 calls together. c10d's own
// append is in its extended API only, which LibTorch 1.13 lacks.
void append_bytes(c10d::Store& store, const std::string& key, const std::vector<std::uint8_t>& bytes);

}  // namespace cohort::store
