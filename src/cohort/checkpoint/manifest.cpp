#include "cohort/checkpoint/manifest.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cohort/checkpoint/atomic_file.h"
#include "cohort/errors.h"

namespace cohort::checkpoint {
namespace {

constexpr const char* kFormat = "cohort-checkpoint";
constexpr int kVersion = 1;

ShardedOptimizerFiles parse_shards(const nlohmann::json& j, const std::string& manifest_path) {
  ShardedOptimizerFiles out;
  out.layout.world_size = j.at("world_size").get<int>();
  out.layout.owner = j.at("owner").get<std::vector<int>>();
  out.files = j.at("files").get<std::vector<std::string>>();
  if (out.layout.world_size < 1 || static_cast<int>(out.files.size()) != out.layout.world_size)
    throw DataError(fmt::format("{}: its optimizer shards ({} files for {} ranks) do not add up", manifest_path,
                                out.files.size(), out.layout.world_size));
  for (int o : out.layout.owner)
    if (o < 0 || o >= out.layout.world_size)
      throw DataError(fmt::format("{}: a parameter's owner, {}, is no shard of {}", manifest_path, o,
                                  out.layout.world_size));
  return out;
}

}  // namespace

std::string shard_file_name(int k, int n) { return fmt::format("optimizer-shard-{:05d}-of-{:05d}.pt", k, n); }

std::string manifest_json(const Manifest& m) {
  nlohmann::json manifest = {{"format", kFormat}, {"version", kVersion}, {"step", m.step},
                             {"files", nlohmann::json::object()}};
  for (const auto& [name, entry] : m.files) manifest["files"][name] = {{"bytes", entry.bytes}, {"crc32", entry.crc32}};
  if (m.shards)
    manifest["optimizer_shards"] = {{"world_size", m.shards->layout.world_size},
                                    {"owner", m.shards->layout.owner},
                                    {"files", m.shards->files}};
  return manifest.dump(2);
}

std::string manifest_json(std::int64_t step, const std::vector<std::string>& names,
                          const std::vector<std::string>& contents) {
  Manifest m;
  m.step = step;
  for (std::size_t i = 0; i < names.size(); ++i) m.files[names[i]] = {contents[i].size(), crc32_of(contents[i])};
  return manifest_json(m);
}

Manifest read_manifest(const std::string& path, std::optional<std::int64_t> step) {
  const std::string manifest_path = path + "/" + kManifestName;
  try {
    const auto j = nlohmann::json::parse(read_whole_file(manifest_path));
    Manifest m;
    m.step = j.value("step", std::int64_t{-1});
    if (j.value("format", "") != kFormat || j.value("version", 0) != kVersion || (step && m.step != *step)) {
      throw DataError(step ? fmt::format("{} is not a version-{} manifest of step {}", manifest_path, kVersion, *step)
                           : fmt::format("{} is not a version-{} checkpoint manifest", manifest_path, kVersion));
    }
    for (const auto& [name, entry] : j.at("files").items())
      m.files[name] = {entry.value("bytes", std::uint64_t{0}), entry.value("crc32", std::uint32_t{0})};
    if (j.contains("optimizer_shards")) m.shards = parse_shards(j.at("optimizer_shards"), manifest_path);
    return m;
  } catch (const DataError&) {
    throw;
  } catch (const nlohmann::json::parse_error& e) {
    throw DataError(fmt::format("{} is not valid JSON ({})", manifest_path, e.what()));
  } catch (const std::exception& e) {
    throw DataError(fmt::format("{}: unreadable ({})", manifest_path, e.what()));
  }
}

std::string read_listed(const std::string& path, const Manifest& manifest, const std::string& name) {
  const auto entry = manifest.files.find(name);
  if (entry == manifest.files.end())
    throw DataError(fmt::format("{}/{} does not list {}", path, kManifestName, name));
  std::string bytes;
  try {
    bytes = read_whole_file(path + "/" + name);
  } catch (const std::exception& e) {
    throw DataError(fmt::format("{}/{} is missing or unreadable ({})", path, name, e.what()));
  }
  if (bytes.size() != entry->second.bytes)
    throw DataError(fmt::format("{}/{} has {} bytes, the manifest says {} (truncated)", path, name, bytes.size(),
                                entry->second.bytes));
  if (crc32_of(bytes) != entry->second.crc32)
    throw DataError(fmt::format("{}/{} fails its CRC-32 (corrupt)", path, name));
  return bytes;
}

std::vector<std::string> read_verified(const std::string& path, std::int64_t step,
                                       const std::vector<std::string>& names) {
  const auto manifest = read_manifest(path, step);
  std::vector<std::string> contents;
  for (const auto& name : names) contents.push_back(read_listed(path, manifest, name));
  return contents;
}

}  // namespace cohort::checkpoint
