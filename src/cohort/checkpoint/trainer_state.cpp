#include "cohort/checkpoint/trainer_state.h"

#include <fmt/format.h>
#include <torch/serialize.h>

#include <cstring>

#include "cohort/checkpoint/torch_format.h"
#include "cohort/errors.h"

namespace cohort::checkpoint {
namespace {

constexpr const char* kFormat = "cohort-trainer-state";
constexpr std::int64_t kVersion = 1;

using GenericDict = c10::impl::GenericDict;
using GenericList = c10::impl::GenericList;

GenericDict new_dict() { return GenericDict(c10::StringType::get(), c10::AnyType::get()); }

// Pickle has no unsigned 64-bit integers; the seed travels as its bit pattern.
std::int64_t as_signed(std::uint64_t v) {
  std::int64_t out;
  std::memcpy(&out, &v, sizeof out);
  return out;
}
std::uint64_t as_unsigned(std::int64_t v) {
  std::uint64_t out;
  std::memcpy(&out, &v, sizeof out);
  return out;
}

c10::IValue field(const GenericDict& dict, const char* key, const std::string& source) {
  const auto it = dict.find(key);
  if (it == dict.end()) {
    throw DataError(fmt::format("{}: has no '{}'; it is not a cohort trainer state", source, key));
  }
  return it->value();
}

std::int64_t int_field(const GenericDict& dict, const char* key, const std::string& source) {
  const auto v = field(dict, key, source);
  if (!v.isInt()) throw DataError(fmt::format("{}: '{}' is not an integer", source, key));
  return v.toInt();
}

}  // namespace

std::string encode_trainer_state(const TrainingProgress& progress,
                                 const std::vector<std::vector<at::Tensor>>& rng) {
  auto dict = new_dict();
  dict.insert("format", std::string(kFormat));
  dict.insert("version", kVersion);
  dict.insert("step", progress.step);
  dict.insert("epoch", progress.epoch);
  dict.insert("epoch_step", progress.epoch_step);
  if (progress.sampler) {
    const auto& s = *progress.sampler;
    auto sampler = new_dict();
    sampler.insert("seed", as_signed(s.seed));
    sampler.insert("shuffle", static_cast<std::int64_t>(s.shuffle));
    sampler.insert("epoch", s.epoch);
    sampler.insert("dataset_size", s.dataset_size);
    sampler.insert("consumed", s.consumed);
    dict.insert("sampler", sampler);
  }
  if (!progress.extra.empty()) {
    auto extra = new_dict();
    for (const auto& [name, value] : progress.extra) extra.insert(name, value);
    dict.insert("extra", extra);
  }
  GenericList ranks(c10::AnyType::get());
  for (const auto& states : rng) {
    GenericList list(c10::TensorType::get());
    for (const auto& t : states) list.push_back(t);
    ranks.push_back(list);
  }
  dict.insert("rng", ranks);
  return torch_save_bytes(dict);
}

TrainerState decode_trainer_state(const std::string& bytes, const std::string& source) {
  const c10::IValue value = torch_load_bytes(bytes, source);
  if (!value.isGenericDict()) throw DataError(fmt::format("{}: is not a dict", source));
  const auto dict = value.toGenericDict();
  const auto format = field(dict, "format", source);
  if (!format.isString() || format.toStringRef() != kFormat ||
      int_field(dict, "version", source) != kVersion) {
    throw DataError(fmt::format("{}: is not a version-{} {}", source, kVersion, kFormat));
  }
  TrainerState state;
  state.progress.step = int_field(dict, "step", source);
  state.progress.epoch = int_field(dict, "epoch", source);
  state.progress.epoch_step = int_field(dict, "epoch_step", source);
  if (dict.contains("sampler")) {
    const auto sampler = field(dict, "sampler", source);
    if (!sampler.isGenericDict()) throw DataError(fmt::format("{}: 'sampler' is not a dict", source));
    const auto s = sampler.toGenericDict();
    data::SamplerState out;
    out.seed = as_unsigned(int_field(s, "seed", source));
    out.shuffle = int_field(s, "shuffle", source) != 0;
    out.epoch = int_field(s, "epoch", source);
    out.dataset_size = int_field(s, "dataset_size", source);
    out.consumed = int_field(s, "consumed", source);
    state.progress.sampler = out;
  }
  if (dict.contains("extra")) {
    const auto extra = field(dict, "extra", source);
    if (!extra.isGenericDict()) throw DataError(fmt::format("{}: 'extra' is not a dict", source));
    for (const auto& item : extra.toGenericDict()) {
      if (!item.key().isString()) throw DataError(fmt::format("{}: 'extra' has a key that is not a string", source));
      state.progress.extra.emplace(item.key().toStringRef(), item.value());
    }
  }
  const auto rng = field(dict, "rng", source);
  if (!rng.isList()) throw DataError(fmt::format("{}: 'rng' is not a list", source));
  for (const auto& rank : rng.toListRef()) {
    if (!rank.isTensorList()) throw DataError(fmt::format("{}: 'rng' holds a non-tensor list", source));
    state.rng.push_back(rank.toTensorVector());
  }
  return state;
}

}  // namespace cohort::checkpoint
