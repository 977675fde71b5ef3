#pragma once
// c10d stores keep values as bytes; cohort's values are short strings.
#include <cstdint>
#include <string>
#include <vector>

namespace cohort::util {

inline std::vector<std::uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }
inline std::string from_bytes(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }

}  // namespace cohort::util
