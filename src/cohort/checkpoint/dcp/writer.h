#pragma once
// Writes a checkpoint in PyTorch's distributed checkpoint format
// (torch.distributed.checkpoint, "DCP"; docs/dcp_format.md), as one writer with
// every tensor whole: `.metadata` and `__0_0.distcp`, which dcp.load reads at any
// world size (it reshards whole chunks itself).
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace cohort::checkpoint::dcp {

// One value of the nested state dict: its flattened key ("model.0.weight"), its path
// in the nested dict ("model", "0.weight"; list positions as ints), and the value: a
// tensor, or a plain value (a number, bool, None, string, or a tuple or list of them).
struct Entry {
  std::string key;
  std::vector<std::variant<std::string, std::int64_t>> path;
  c10::IValue value;
};

struct Written {
  std::int64_t tensors = 0;
  std::int64_t values = 0;
  std::uint64_t bytes = 0;  // of the data file
};

inline constexpr const char* kDataFile = "__0_0.distcp";
inline constexpr const char* kMetadataFile = ".metadata";

struct Encoded {
  std::string data;      // kDataFile's bytes
  std::string metadata;  // kMetadataFile's bytes
  Written written;
};

// The checkpoint's two files, in memory. Throws cohort::ConfigError for a key given
// twice or a value DCP cannot hold.
Encoded encode_checkpoint(const std::vector<Entry>& entries);

// Writes `entries` into the directory `out`, which must not exist yet; the
// directory appears whole or not at all (written under a temporary name, fsync'ed,
// renamed: Note [Atomic replace]). Throws cohort::Error naming the path on failure,
// cohort::ConfigError for a key given twice or a value DCP cannot hold.
Written write_checkpoint(const std::string& out, const std::vector<Entry>& entries);

}  // namespace cohort::checkpoint::dcp
