#pragma once
// Compares the state dicts the trainer saves (--save-final, PyTorch's zip format).
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace cohort::testing {

inline c10::Dict<c10::IValue, c10::IValue> load_state(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toGenericDict();
}

// The largest elementwise difference between two state dicts with the same keys.
inline double max_difference(const std::string& a, const std::string& b) {
  auto da = load_state(a), db = load_state(b);
  EXPECT_EQ(da.size(), db.size());
  double worst = 0;
  for (const auto& entry : da) {
    const auto other = db.find(entry.key());
    if (other == db.end()) {
      ADD_FAILURE() << "missing " << entry.key().toStringRef();
      continue;
    }
    worst = std::max(worst, (entry.value().toTensor() - other->value().toTensor()).abs().max().item<double>());
  }
  return worst;
}

inline bool bitwise_equal(const std::string& a, const std::string& b) {
  auto da = load_state(a), db = load_state(b);
  if (da.size() != db.size()) return false;
  for (const auto& entry : da) {
    const auto other = db.find(entry.key());
    if (other == db.end() || !torch::equal(entry.value().toTensor(), other->value().toTensor())) return false;
  }
  return true;
}

}  // namespace cohort::testing
