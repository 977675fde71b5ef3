#pragma once
// Reads a checkpoint in PyTorch's distributed checkpoint format (torch.distributed.
// checkpoint, "DCP"; docs/dcp_format.md), whoever wrote it and at whatever world size:
// dcp.save or dcp.async_save of plain, DDP, FSDP2 or tensor-parallel (DTensor) state,
// or cohort. Every tensor comes back whole, its saved chunks put together, so that a
// cohort run reshards it as it reshards its own whole checkpoints: to any world size,
// to ZeRO-1/2/3 and to tensor-parallel layouts (Note [Checkpoints hold whole tensors]).
#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cohort/checkpoint/dcp/writer.h"

namespace cohort::checkpoint::dcp {

// One saved piece of a tensor (or the one item of a plain value), and where it lies.
struct Chunk {
  std::vector<std::int64_t> offsets;  // in the whole tensor; empty for a plain value
  std::vector<std::int64_t> sizes;
  std::string file;  // a data file of the checkpoint's directory (`__0_0.distcp`)
  std::int64_t offset = 0;  // of its bytes in that file
  std::int64_t length = 0;
};

struct Item {
  std::string key;  // flattened: "optim.state.0.weight.exp_avg"
  std::vector<std::variant<std::string, std::int64_t>> path;  // ("optim", "state", "0.weight", "exp_avg")
  bool tensor = false;
  at::ScalarType dtype = at::kFloat;  // tensors
  std::vector<std::int64_t> size;     // tensors: the whole shape
  std::vector<Chunk> chunks;          // tensors: every saved piece, tiling `size`
};

struct Metadata {
  std::vector<Item> items;         // in .metadata's order
  std::vector<std::string> files;  // the data files it names, sorted
};

// `.metadata`'s bytes. Throws cohort::DataError naming `source` for anything else: not
// a pickle, not DCP's classes, a dtype or field that cannot be, a tensor whose chunks
// overlap, leave a hole or lie outside it, a data file outside the directory.
Metadata parse_metadata(const std::string& bytes, const std::string& source);

// Returns `length` bytes at `offset` of the data file `file`.
using ReadBytes = std::function<std::string(const std::string& file, std::int64_t offset, std::int64_t length)>;

// Every value of the checkpoint, tensors whole on the CPU with their saved dtype, in
// .metadata's order. Each item is read once. Throws cohort::DataError naming `source`
// and the key for an item that is not what the metadata says.
std::vector<Entry> read_entries(const Metadata& metadata, const ReadBytes& read, const std::string& source);

// The same from the checkpoint directory `directory`: its .metadata, then its data
// files, each read must lie inside its file.
Metadata read_metadata(const std::string& directory);
ReadBytes directory_reader(const std::string& directory);
std::vector<Entry> read_checkpoint(const std::string& directory);

// Whether `directory` holds a distributed checkpoint (its .metadata).
bool is_dcp_directory(const std::string& directory);

}  // namespace cohort::checkpoint::dcp
