#pragma once
// Integers read from JSON that cohort did not necessarily write: checkpoint manifests,
// layout files, store records.
//
// Note [Integers from JSON]
// nlohmann::json's get<T>() converts whatever number a document holds: a float such
// as 2e72 into an integer type is undefined behaviour (fuzz_checkpoint_manifest's
// finding under UBSan, CI of 2026-12-07), and an integer wider than T is cut down
// without a word (a CRC-32 of 2^32 + c would pass as c). These read only an integer
// that T holds exactly, and throw nlohmann's own type_error or out_of_range
// otherwise, so every caller's existing `catch (const nlohmann::json::exception&)`
// turns them into its error message naming the file.
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace cohort::util {

template <typename T>
T json_integer(const nlohmann::json& value, const std::string& what) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>, "an integer type");
  if (!value.is_number_integer())
    throw nlohmann::json::type_error::create(302, what + " must be an integer, not " + value.dump(), &value);
  bool fits = false;
  if (value.is_number_unsigned()) {
    fits = value.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<T>::max());
  } else {
    const auto v = value.get<std::int64_t>();
    if constexpr (std::is_signed_v<T>)
      fits = v >= static_cast<std::int64_t>(std::numeric_limits<T>::min()) &&
             v <= static_cast<std::int64_t>(std::numeric_limits<T>::max());
    else
      fits = v >= 0 && static_cast<std::uint64_t>(v) <= static_cast<std::uint64_t>(std::numeric_limits<T>::max());
  }
  if (!fits)
    throw nlohmann::json::out_of_range::create(406, what + " = " + value.dump() + " is out of range", &value);
  return value.get<T>();
}

// object[key], which must be there.
template <typename T>
T json_integer_at(const nlohmann::json& object, const std::string& key) {
  return json_integer<T>(object.at(key), key);
}

// object[key], or `otherwise` when the object has no such key.
template <typename T>
T json_integer_or(const nlohmann::json& object, const std::string& key, T otherwise) {
  const auto it = object.find(key);
  return it == object.end() ? otherwise : json_integer<T>(*it, key);
}

template <typename T>
std::vector<T> json_integers_at(const nlohmann::json& object, const std::string& key) {
  const auto& list = object.at(key);
  if (!list.is_array()) throw nlohmann::json::type_error::create(302, key + " must be a list of integers", &list);
  std::vector<T> out;
  out.reserve(list.size());
  for (const auto& v : list) out.push_back(json_integer<T>(v, key + "[]"));
  return out;
}

}  // namespace cohort::util
