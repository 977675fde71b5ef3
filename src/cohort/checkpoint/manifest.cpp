#include "cohort/checkpoint/manifest.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cohort/checkpoint/atomic_file.h"
#include "cohort/errors.h"
#include "cohort/util/json_integer.h"

namespace cohort::checkpoint {
namespace {

constexpr const char* kFormat = "cohort-checkpoint";
// Version 2 adds the manifest's own checksum (Note [The manifest's own checksum]);
// version 1 manifests (no checksum) still load.
constexpr int kVersion = 2;
constexpr int kOldestVersion = 1;
constexpr const char* kSelfChecksum = "manifest_crc32";

// Note [The manifest's own checksum]
// The manifest guards every other file, and nothing guarded the manifest: one bit
// flipped in a sharded checkpoint's owner or files list still parses, and then a
// resume fails with no fallback, or consolidate writes one parameter's Adam state
// under another's index with exit 0. So the manifest carries manifest_crc32, the
// CRC-32 of its canonical body: the JSON object without that field, dumped compactly
// with its keys sorted (nlohmann::json's order; for the ASCII names and integers
// of a manifest, Python's json.dumps(body, separators=(",", ":"), sort_keys=True)
// gives the same bytes). Canonical, not
// the bytes on disk, so that re-indenting the file keeps it valid. A manifest that
// fails it is corrupt (a DataError): load_latest falls back past it, and
// consolidate refuses it naming the file. A single flipped bit cannot turn the
// version 2 into 1 (0x32 and 0x31 differ in two bits), so a damaged version-2
// manifest never passes as an unchecked version-1 one.
std::uint32_t body_crc32(const nlohmann::json& body) { return crc32_of(body.dump()); }

void check_own_checksum(nlohmann::json j, const std::string& manifest_path) {
  const auto it = j.find(kSelfChecksum);
  if (it == j.end() || !it->is_number_unsigned())
    throw DataError(fmt::format("{} has no {} (its own checksum, which a version-{} manifest carries); it is "
                                "damaged",
                                manifest_path, kSelfChecksum, kVersion));
  const auto saved = it->get<std::uint64_t>();
  j.erase(kSelfChecksum);
  if (saved != body_crc32(j))
    throw DataError(fmt::format("{} fails its own CRC-32 ({}); the manifest is corrupt", manifest_path,
                                kSelfChecksum));
}

// A name in the manifest is a file of the checkpoint directory itself.
void check_file_name(const std::string& name, const std::string& manifest_path) {
  if (name.empty() || name == "." || name == ".." || name == kManifestName ||
      name.find('/') != std::string::npos || name.find('\0') != std::string::npos)
    throw DataError(fmt::format("{} lists '{}', which is no file name of a checkpoint", manifest_path, name));
}

ShardedOptimizerFiles parse_shards(const nlohmann::json& j) {
  ShardedOptimizerFiles out;
  out.layout.world_size = util::json_integer_at<int>(j, "world_size");
  out.layout.owner = util::json_integers_at<int>(j, "owner");
  out.files = j.at("files").get<std::vector<std::string>>();
  return out;
}

// Note [A consistent shard layout]: whatever its checksum says, a sharded manifest
// must describe shards that can exist: shard k of n is the file
// optimizer-shard-k-of-n.pt (so no name twice, none of another world size), each is
// listed with its size and CRC-32, the files are exactly the model, the trainer
// state and the shards, every owner is a shard, and a shard is empty exactly when it
// owns no parameter (consolidate would otherwise drop states without a word).
void check_shards(const Manifest& m, const std::string& manifest_path) {
  const auto& shards = *m.shards;
  const int n = shards.layout.world_size;
  if (n < 1 || static_cast<int>(shards.files.size()) != n)
    throw DataError(fmt::format("{}: its optimizer shards ({} files for {} ranks) do not add up", manifest_path,
                                shards.files.size(), n));
  std::vector<std::size_t> owned(static_cast<std::size_t>(n), 0);
  for (std::size_t i = 0; i < shards.layout.owner.size(); ++i) {
    const int o = shards.layout.owner[i];
    if (o < 0 || o >= n)
      throw DataError(fmt::format("{}: parameter {}'s owner, {}, is no shard of {}", manifest_path, i, o, n));
    ++owned[static_cast<std::size_t>(o)];
  }
  for (int k = 0; k < n; ++k) {
    const auto& name = shards.files[static_cast<std::size_t>(k)];
    if (name != shard_file_name(k, n))
      throw DataError(fmt::format("{}: shard {} of {} is '{}'; it must be {}", manifest_path, k, n, name,
                                  shard_file_name(k, n)));
    const auto entry = m.files.find(name);
    if (entry == m.files.end())
      throw DataError(fmt::format("{} does not list the size and CRC-32 of its shard {}", manifest_path, name));
    const auto params = owned[static_cast<std::size_t>(k)];
    if ((entry->second.bytes == 0) != (params == 0))
      throw DataError(fmt::format("{}: shard {} has {} bytes and owns {} parameters; a shard is empty exactly "
                                  "when it owns none",
                                  manifest_path, name, entry->second.bytes, params));
  }
  for (const auto& [name, entry] : m.files)
    if (name != "model.pt" && name != "trainer.pt" && name.rfind("optimizer-shard-", 0) != 0)
      throw DataError(fmt::format("{} lists {}, which a sharded checkpoint does not hold", manifest_path, name));
  if (m.files.size() != static_cast<std::size_t>(n) + 2 || !m.files.count("model.pt") || !m.files.count("trainer.pt"))
    throw DataError(fmt::format("{}: a sharded checkpoint holds model.pt, trainer.pt and its {} shards, and it "
                                "lists {} files",
                                manifest_path, n, m.files.size()));
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
  manifest[kSelfChecksum] = body_crc32(manifest);  // Note [The manifest's own checksum]
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
    // Note [Integers from JSON]
    m.step = util::json_integer_or<std::int64_t>(j, "step", -1);
    const int version = util::json_integer_or<int>(j, "version", 0);
    if (j.value("format", "") != kFormat || version < kOldestVersion || version > kVersion ||
        (step && m.step != *step)) {
      throw DataError(step ? fmt::format("{} is not a version-{} to {} manifest of step {}", manifest_path,
                                         kOldestVersion, kVersion, *step)
                           : fmt::format("{} is not a version-{} to {} checkpoint manifest", manifest_path,
                                         kOldestVersion, kVersion));
    }
    if (version >= 2) check_own_checksum(j, manifest_path);
    for (const auto& [name, entry] : j.at("files").items()) {
      check_file_name(name, manifest_path);
      m.files[name] = {util::json_integer_at<std::uint64_t>(entry, "bytes"),
                       util::json_integer_at<std::uint32_t>(entry, "crc32")};
    }
    if (j.contains("optimizer_shards")) {
      m.shards = parse_shards(j.at("optimizer_shards"));
      check_shards(m, manifest_path);
    }
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

Manifest verify_checkpoint(const std::string& path, std::optional<std::int64_t> step) {
  const auto manifest = read_manifest(path, step);
  std::vector<std::string> needed = {"model.pt", "trainer.pt"};
  if (manifest.files.count(".metadata") != 0) {
    // In PyTorch's format (Note [Checkpoints in PyTorch's format]): all of its files.
    needed.clear();
    for (const auto& [name, entry] : manifest.files) needed.push_back(name);
  } else if (manifest.shards)
    needed.insert(needed.end(), manifest.shards->files.begin(), manifest.shards->files.end());
  else
    needed.push_back("optimizer.pt");
  for (const auto& name : needed) read_listed(path, manifest, name);
  return manifest;
}

std::vector<std::string> read_verified(const std::string& path, std::int64_t step,
                                       const std::vector<std::string>& names) {
  const auto manifest = read_manifest(path, step);
  std::vector<std::string> contents;
  for (const auto& name : names) contents.push_back(read_listed(path, manifest, name));
  return contents;
}

}  // namespace cohort::checkpoint
