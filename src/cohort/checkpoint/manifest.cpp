#include "cohort/checkpoint/manifest.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cohort/checkpoint/atomic_file.h"
#include "cohort/errors.h"

namespace cohort::checkpoint {
namespace {

constexpr const char* kFormat = "cohort-checkpoint";
constexpr int kVersion = 1;

}  // namespace

std::string manifest_json(std::int64_t step, const std::vector<std::string>& names,
                          const std::vector<std::string>& contents) {
  nlohmann::json manifest = {{"format", kFormat}, {"version", kVersion}, {"step", step},
                             {"files", nlohmann::json::object()}};
  for (std::size_t i = 0; i < names.size(); ++i) {
    manifest["files"][names[i]] = {{"bytes", contents[i].size()}, {"crc32", crc32_of(contents[i])}};
  }
  return manifest.dump(2);
}

std::vector<std::string> read_verified(const std::string& path, std::int64_t step,
                                       const std::vector<std::string>& names) {
  const std::string manifest_path = path + "/" + kManifestName;
  try {
    const auto manifest = nlohmann::json::parse(read_whole_file(manifest_path));
    if (manifest.value("format", "") != kFormat || manifest.value("version", 0) != kVersion ||
        manifest.value("step", std::int64_t{-1}) != step) {
      throw DataError(fmt::format("{} is not a version-{} manifest of step {}", manifest_path, kVersion, step));
    }
    std::vector<std::string> contents;
    for (const auto& name : names) {
      const auto entry = manifest.at("files").find(name);
      if (entry == manifest.at("files").end()) {
        throw DataError(fmt::format("{} does not list {}", manifest_path, name));
      }
      std::string bytes = read_whole_file(path + "/" + name);
      const auto size = entry->value("bytes", std::uint64_t{0});
      if (bytes.size() != size) {
        throw DataError(fmt::format("{}/{} has {} bytes, the manifest says {} (truncated)", path, name,
                                    bytes.size(), size));
      }
      if (crc32_of(bytes) != entry->value("crc32", std::uint32_t{0})) {
        throw DataError(fmt::format("{}/{} fails its CRC-32 (corrupt)", path, name));
      }
      contents.push_back(std::move(bytes));
    }
    return contents;
  } catch (const DataError&) {
    throw;
  } catch (const nlohmann::json::parse_error& e) {
    throw DataError(fmt::format("{} is not valid JSON ({})", manifest_path, e.what()));
  } catch (const std::exception& e) {
    throw DataError(fmt::format("{}: unreadable ({})", path, e.what()));
  }
}

}  // namespace cohort::checkpoint
