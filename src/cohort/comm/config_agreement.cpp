#include "cohort/comm/config_agreement.h"

#include <fmt/format.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>

#include "cohort/comm/world.h"
#include "cohort/errors.h"

namespace cohort::comm {
namespace {

// Each setting as "<bytes of name>:<name><bytes of value>:<value>": any byte may be in
// a value (a path), and the text decodes back to the same list.
// Sorted, so that ranks listing the same settings in another order agree.
std::string encode(std::vector<Setting> settings) {
  std::sort(settings.begin(), settings.end());
  std::string out;
  for (const auto& [name, value] : settings)
    out += fmt::format("{}:{}{}:{}", name.size(), name, value.size(), value);
  return out;
}

std::vector<Setting> decode(const std::string& text, int rank) {
  std::vector<Setting> out;
  std::size_t at = 0;
  auto field = [&]() {
    const auto colon = text.find(':', at);
    if (colon == std::string::npos || colon == at || colon - at > 9 ||
        text.find_first_not_of("0123456789", at) != colon)
      throw Error(fmt::format("cohort: agree_on_settings: the settings rank {} sent do not decode at byte {}", rank,
                              at));
    const auto n = static_cast<std::size_t>(std::stoull(text.substr(at, colon - at)));
    if (n > text.size() - colon - 1)
      throw Error(fmt::format("cohort: agree_on_settings: the settings rank {} sent end early", rank));
    at = colon + 1 + n;
    return text.substr(colon + 1, n);
  };
  while (at < text.size()) {
    auto name = field();
    auto value = field();
    out.emplace_back(std::move(name), std::move(value));
  }
  return out;
}

// FNV-1a: agreement is decided on (length, hash), so a collision would have to keep the
// length too; the text itself is gathered only when they differ.
std::int64_t hash_of(const std::string& text) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<std::int64_t>(h);
}

// "rank 1", "ranks 0,2", "ranks 0-3,5".
std::string describe_ranks(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j - i >= 2 ? fmt::format("{}-{}", ranks[i], ranks[j]) : std::to_string(ranks[i]);
    if (j - i == 1) out += "," + std::to_string(ranks[j]);
    i = j + 1;
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + out;
}

std::string shown(const std::optional<std::string>& value) {
  if (!value) return "(not set)";
  if (value->empty()) return "\"\"";
  return *value;
}

// At most this many values are listed for one setting; the rest are counted.
constexpr std::size_t kValuesShown = 8;

}  // namespace

std::string describe_disagreement(const std::vector<std::vector<Setting>>& by_rank, const std::vector<int>& ranks) {
  TORCH_INTERNAL_ASSERT(by_rank.size() == ranks.size());
  std::vector<std::string> names;  // in the order of first appearance, rank by rank
  std::vector<std::map<std::string, std::string>> values(by_rank.size());
  for (std::size_t r = 0; r < by_rank.size(); ++r)
    for (const auto& [name, value] : by_rank[r]) {
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
      values[r][name] = value;
    }
  std::string out;
  for (const auto& name : names) {
    // Each value with the ranks holding it, in the order of its first holder.
    std::vector<std::pair<std::optional<std::string>, std::vector<int>>> held;
    for (std::size_t r = 0; r < by_rank.size(); ++r) {
      const auto it = values[r].find(name);
      std::optional<std::string> v;
      if (it != values[r].end()) v = it->second;
      auto same = std::find_if(held.begin(), held.end(), [&](const auto& h) { return h.first == v; });
      if (same == held.end()) held.push_back({v, {ranks[r]}});
      else same->second.push_back(ranks[r]);
    }
    if (held.size() < 2) continue;
    std::string parts;
    for (std::size_t i = 0; i < held.size() && i < kValuesShown; ++i)
      parts += fmt::format("{}{} on {}", i ? "; " : "", shown(held[i].first), describe_ranks(held[i].second));
    if (held.size() > kValuesShown) parts += fmt::format("; and {} other values", held.size() - kValuesShown);
    out += fmt::format("{} differs across ranks: {}. ", name, parts);
  }
  if (out.empty()) return out;
  return "cohort: the ranks were started with different settings: " + out +
         "Pass the same flags to every rank (on every node, the same program arguments)";
}

void agree_on_settings(const World& world, const std::vector<Setting>& settings) {
  const auto mine = encode(settings);
  auto& group = world.group();
  const auto device = world.device();
  const auto on_cpu = at::TensorOptions().dtype(at::kLong);
  // (length, hash) of every rank's text: equal everywhere is agreement.
  const std::vector<std::int64_t> own{static_cast<std::int64_t>(mine.size()), hash_of(mine)};
  const auto summary = at::tensor(own, on_cpu).to(device);
  std::vector<std::int64_t> lengths;
  bool agree = true;
  std::vector<std::int64_t> first;
  for (const auto& part : group.all_gather(summary)) {
    const auto p = part.to(at::kCPU);
    const std::vector<std::int64_t> v{p[0].item<std::int64_t>(), p[1].item<std::int64_t>()};
    if (first.empty()) first = v;
    agree = agree && v == first;
    lengths.push_back(v[0]);
  }
  if (agree) return;
  const auto longest = *std::max_element(lengths.begin(), lengths.end());
  if (longest > static_cast<std::int64_t>(kMaxSettingsBytes))  // every rank sees it, and every rank stops here
    throw ConfigError(fmt::format("cohort: agree_on_settings: a rank's settings take {} bytes, more than the {} it "
                                  "compares; list fewer or shorter settings",
                                  longest, kMaxSettingsBytes));
  // The texts, each padded to the longest.
  auto bytes = at::zeros({std::max<std::int64_t>(longest, 1)}, at::TensorOptions().dtype(at::kByte));
  std::copy(mine.begin(), mine.end(), bytes.data_ptr<std::uint8_t>());
  const auto parts = group.all_gather(bytes.to(device));
  std::vector<std::vector<Setting>> by_rank;
  for (std::size_t r = 0; r < parts.size(); ++r) {
    const auto p = parts[r].to(at::kCPU).contiguous();
    const auto* data = p.data_ptr<std::uint8_t>();
    by_rank.push_back(decode(std::string(data, data + lengths[r]), group.global_ranks()[r]));
  }
  const auto message = describe_disagreement(by_rank, group.global_ranks());
  // Empty only when a list names a setting twice and its last value agrees: every
  // rank reads the same texts, so every rank returns here alike.
  if (!message.empty()) throw ConfigError(message);
}

}  // namespace cohort::comm
