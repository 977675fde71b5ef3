#pragma once
// MANIFEST.json of a checkpoint directory (Note [Checkpoint directories]): the step,
// and the size and CRC-32 of every file, written after the files, so that a
// directory with a manifest is complete and a file damaged later is caught on load.
#include <cstdint>
#include <string>
#include <vector>

namespace cohort::checkpoint {

inline constexpr const char* kManifestName = "MANIFEST.json";

// The manifest of `names` holding `contents` (same order), for checkpoint `step`.
std::string manifest_json(std::int64_t step, const std::vector<std::string>& names,
                          const std::vector<std::string>& contents);

// The files `names` of the checkpoint directory `path`, each checked against its
// manifest. Whatever is wrong (a missing, malformed or foreign manifest, a truncated
// or corrupt file) throws cohort::DataError saying what, so that callers can turn
// any failure into one collective answer.
std::vector<std::string> read_verified(const std::string& path, std::int64_t step,
                                       const std::vector<std::string>& names);

}  // namespace cohort::checkpoint
