#pragma once
// MANIFEST.json of a checkpoint directory (Note [Checkpoint directories]): the step,
// and the size and CRC-32 of every file, written after the files, so that a
// directory with a manifest is complete and a file damaged later is caught on load.
// A sharded checkpoint's manifest also holds its shard layout (sharded_state.h).
// The manifest carries a CRC-32 of its own content (Note [The manifest's own
// checksum] in manifest.cpp); a version-1 manifest, written before it had one, is
// read without it.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cohort/checkpoint/sharded_state.h"

namespace cohort::checkpoint {

inline constexpr const char* kManifestName = "MANIFEST.json";

struct FileEntry {
  std::uint64_t bytes = 0;
  std::uint32_t crc32 = 0;
};

// The optimizer state of a sharded checkpoint: shard k is the file files[k].
struct ShardedOptimizerFiles {
  ShardLayout layout;
  std::vector<std::string> files;
};

struct Manifest {
  std::int64_t step = 0;
  std::map<std::string, FileEntry> files;
  std::optional<ShardedOptimizerFiles> shards;
};

// The name of shard k of n in a sharded checkpoint.
std::string shard_file_name(int k, int n);

// The manifest of `names` holding `contents` (same order), for checkpoint `step`.
std::string manifest_json(std::int64_t step, const std::vector<std::string>& names,
                          const std::vector<std::string>& contents);
// The same from the files' sizes and checksums, with a shard layout when sharded.
std::string manifest_json(const Manifest& manifest);

// The manifest of the checkpoint directory `path`; a missing, malformed, corrupt
// (failing its own checksum), inconsistent (a shard layout that cannot be: Note [A
// consistent shard layout]) or foreign one (not of `step`, when given) throws
// cohort::DataError naming the file and saying what.
Manifest read_manifest(const std::string& path, std::optional<std::int64_t> step = std::nullopt);

// The file `name` of the directory `path`, checked against its manifest: a file
// the manifest does not list, a missing, truncated or corrupt one throws
// cohort::DataError naming it.
std::string read_listed(const std::string& path, const Manifest& manifest, const std::string& name);

// The manifest of the checkpoint directory `path` (of `step`, when given) after
// checking against it, one at a time (a sharded checkpoint's files may not fit in
// memory together), every file a load reads: model.pt, trainer.pt, and optimizer.pt
// or each optimizer shard. Whatever is wrong throws cohort::DataError naming the file.
// Checkpointer::load_latest and `cohort checkpoint consolidate` choose with it.
Manifest verify_checkpoint(const std::string& path, std::optional<std::int64_t> step = std::nullopt);

// The files `names` of the checkpoint directory `path`, each checked against its
// manifest. Whatever is wrong (a missing, malformed or foreign manifest, a truncated
// or corrupt file) throws cohort::DataError saying what, so that callers can turn
// any failure into one collective answer.
std::vector<std::string> read_verified(const std::string& path, std::int64_t step,
                                       const std::vector<std::string>& names);

}  // namespace cohort::checkpoint
