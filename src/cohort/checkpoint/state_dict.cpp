#include "cohort/checkpoint/state_dict.h"

#include <fmt/format.h>
#include <torch/serialize.h>

#include <set>
#include <sstream>
#include <vector>

#include "cohort/checkpoint/atomic_file.h"
#include "cohort/checkpoint/torch_format.h"
#include "cohort/errors.h"

namespace cohort::checkpoint {
namespace {

std::string shape_of(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes() << " " << t.dtype();
  return out.str();
}

// Parameters, then buffers, as PyTorch orders a state dict within each module.
std::vector<std::pair<std::string, at::Tensor>> named_tensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module.named_parameters()) out.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

}  // namespace

c10::Dict<std::string, at::Tensor> state_dict(const torch::nn::Module& module) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : named_tensors(module)) {
    // A copy owns exactly its elements: a parameter that views a larger storage would
    // otherwise drag all of it into the file.
    dict.insert(name, tensor.detach().to(at::kCPU).contiguous().clone());
  }
  return dict;
}

std::string state_dict_bytes(const torch::nn::Module& module) {
  return torch_save_bytes(state_dict(module));
}

void save_state_dict(const torch::nn::Module& module, const std::string& path) {
  write_file_atomically(path, state_dict_bytes(module));
}

void load_state_dict(torch::nn::Module& module, const std::string& bytes, const std::string& source) {
  check_state_dict(module, bytes, source).apply();
}

void CheckedStateDict::apply() const {
  torch::NoGradGuard no_grad;
  for (const auto& [target, saved] : copies_) target.copy_(saved);
}

CheckedStateDict check_state_dict(torch::nn::Module& module, const std::string& bytes, const std::string& source) {
  return check_state_dict(module, torch_load_bytes(bytes, source), source);
}

CheckedStateDict check_state_dict(torch::nn::Module& module, const c10::IValue& value, const std::string& source) {
  if (!value.isGenericDict()) {
    throw DataError(fmt::format("{}: holds a {}, not a state dict (dict[str, Tensor])", source,
                                value.tagKind()));
  }
  const auto dict = value.toGenericDict();
  // Check everything before changing anything, so a mismatch leaves the model as it was.
  CheckedStateDict checked;
  auto& copies = checked.copies_;
  std::set<std::string> expected;
  for (const auto& [name, target] : named_tensors(module)) {
    expected.insert(name);
    const auto it = dict.find(name);
    if (it == dict.end()) {
      throw ConfigError(fmt::format("{}: has no '{}', which the model has; it was saved from "
                                    "another model (check the architecture's flags)",
                                    source, name));
    }
    if (!it->value().isTensor()) {
      throw DataError(fmt::format("{}: '{}' is not a tensor", source, name));
    }
    const at::Tensor saved = it->value().toTensor();
    if (saved.sizes() != target.sizes() || saved.scalar_type() != target.scalar_type()) {
      throw ConfigError(fmt::format("{}: '{}' is {} but the model's is {}; it was saved from "
                                    "another model (check the architecture's flags)",
                                    source, name, shape_of(saved), shape_of(target)));
    }
    copies.emplace_back(target, saved);
  }
  for (const auto& entry : dict) {
    // toStringRef() of another type is LibTorch's internal assert, not our error.
    if (!entry.key().isString()) {
      throw DataError(fmt::format("{}: has a key of type {}, not a parameter name", source, entry.key().tagKind()));
    }
    const std::string key = entry.key().toStringRef();
    if (expected.count(key) == 0) {
      throw ConfigError(fmt::format("{}: has '{}', which the model does not have; it was saved "
                                    "from another model (check the architecture's flags)",
                                    source, key));
    }
  }
  return checked;
}

void load_state_dict_file(torch::nn::Module& module, const std::string& path) {
  load_state_dict(module, read_whole_file(path), path);
}

}  // namespace cohort::checkpoint
