#pragma once
// Standard base64 (RFC 4648, padded), as etcd's JSON API carries keys and values.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cohort::store {

std::string base64_encode(const std::uint8_t* data, std::size_t size);
inline std::string base64_encode(const std::string& s) {
  return base64_encode(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
}
inline std::string base64_encode(const std::vector<std::uint8_t>& b) { return base64_encode(b.data(), b.size()); }
// nullopt when `text` is not padded base64.
std::optional<std::vector<std::uint8_t>> base64_decode(const std::string& text);

}  // namespace cohort::store
