#include "cohort/checkpoint/dcp/reader.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "cohort/checkpoint/dcp/unpickler.h"
#include "cohort/checkpoint/torch_format.h"
#include "cohort/errors.h"

namespace fs = std::filesystem;

namespace cohort::checkpoint::dcp {
namespace {

using Kind = Pickled::Kind;

class Fields {
 public:
  explicit Fields(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(fmt::format("{}: not the metadata of a distributed checkpoint: {}", source_, what));
  }
  const Pickled& field(const Pickled& object, const std::string& name, const std::string& where) const {
    const Pickled* v = object.find(name);
    if (v == nullptr) fail(fmt::format("{} has no '{}' ({})", where, name, object.describe()));
    return *v;
  }
  void expect_class(const Pickled& p, const std::string& name, const std::string& where) const {
    // The module moves between PyTorch versions; the class name is what says what it is.
    const auto dot = p.text.rfind('.');
    if (!p.is(Kind::kObject) || p.text.substr(dot == std::string::npos ? 0 : dot + 1) != name)
      fail(fmt::format("{} is {}, not a {}", where, p.describe(), name));
  }
  std::int64_t integer(const Pickled& p, const std::string& where) const {
    if (!p.is(Kind::kInt)) fail(fmt::format("{} is {}, not an integer", where, p.describe()));
    return p.integer;
  }
  const std::string& string(const Pickled& p, const std::string& where) const {
    if (!p.is(Kind::kString)) fail(fmt::format("{} is {}, not a string", where, p.describe()));
    return p.text;
  }
  // torch.Size((d0, d1, ...)), or a plain tuple or list of ints.
  std::vector<std::int64_t> ints(const Pickled& p, const std::string& where) const {
    const Pickled* seq = &p;
    if (p.is(Kind::kObject) && p.text == "torch.Size") {
      if (p.items.size() > 1) fail(fmt::format("{} is {}", where, p.describe()));
      if (p.items.empty()) return {};
      seq = p.items[0];
    }
    if (!seq->is(Kind::kTuple) && !seq->is(Kind::kList)) fail(fmt::format("{} is {}, not a shape", where, p.describe()));
    std::vector<std::int64_t> out;
    for (const auto* d : seq->items) out.push_back(integer(*d, where));
    return out;
  }

 private:
  std::string source_;
};

at::ScalarType dtype_of(const Pickled& p, const Fields& f, const std::string& key) {
  static const std::map<std::string, at::ScalarType> kTypes = {
      {"torch.float32", at::kFloat},   {"torch.float", at::kFloat},      {"torch.float64", at::kDouble},
      {"torch.double", at::kDouble},   {"torch.float16", at::kHalf},     {"torch.half", at::kHalf},
      {"torch.bfloat16", at::kBFloat16}, {"torch.int64", at::kLong},     {"torch.long", at::kLong},
      {"torch.int32", at::kInt},       {"torch.int", at::kInt},          {"torch.int16", at::kShort},
      {"torch.short", at::kShort},     {"torch.int8", at::kChar},        {"torch.uint8", at::kByte},
      {"torch.bool", at::kBool}};
  if (p.is(Kind::kGlobal)) {
    const auto it = kTypes.find(p.text);
    if (it != kTypes.end()) return it->second;
  }
  f.fail(fmt::format("'{}' has the dtype {}, which is not read here (floats, integers and bool are)", key,
                     p.describe()));
}

bool overlap(const Chunk& a, const Chunk& b) {
  for (std::size_t d = 0; d < a.offsets.size(); ++d)
    if (a.offsets[d] + a.sizes[d] <= b.offsets[d] || b.offsets[d] + b.sizes[d] <= a.offsets[d]) return false;
  return true;
}

// Note [Chunks tile the tensor]: inside the shape, no two overlapping, and their
// volumes adding up to the whole: together that is an exact tiling, so every element
// of the whole tensor is read from exactly one item.
void check_tiling(const Item& item, const Fields& f) {
  std::int64_t volume = 0, whole = 1, stored = 0;
  for (auto d : item.size) {
    if (d < 0) f.fail(fmt::format("'{}' has a negative size", item.key));
    if (__builtin_mul_overflow(whole, d, &whole)) f.fail(fmt::format("'{}' has a size past 2^63 elements", item.key));
  }
  for (std::size_t i = 0; i < item.chunks.size(); ++i) {
    const Chunk& c = item.chunks[i];
    if (c.offsets.size() != item.size.size() || c.sizes.size() != item.size.size())
      f.fail(fmt::format("a chunk of '{}' has {} offsets and {} sizes for a tensor of {} dimensions", item.key,
                         c.offsets.size(), c.sizes.size(), item.size.size()));
    std::int64_t v = 1;
    for (std::size_t d = 0; d < item.size.size(); ++d) {
      if (c.offsets[d] < 0 || c.sizes[d] < 0 || c.offsets[d] > item.size[d] || c.sizes[d] > item.size[d] - c.offsets[d])
        f.fail(fmt::format("a chunk of '{}' lies outside its shape (dimension {})", item.key, d));
      v *= c.sizes[d];  // no overflow: at most the whole's count
    }
    for (std::size_t j = 0; j < i; ++j)
      if (v > 0 && overlap(c, item.chunks[j])) f.fail(fmt::format("two chunks of '{}' overlap", item.key));
    volume += v;  // no overflow: chunks inside the whole that do not overlap
    if (__builtin_add_overflow(stored, c.length, &stored)) f.fail(fmt::format("'{}' has items past 2^63 bytes", item.key));
  }
  if (volume != whole)
    f.fail(fmt::format("the chunks of '{}' hold {} of its {} elements; a data file's worth is missing", item.key,
                       volume, whole));
  // Each item holds its chunk's bytes: a shape its items cannot fill is refused
  // before anything of its size is allocated.
  std::int64_t bytes = 0;
  if (__builtin_mul_overflow(whole, static_cast<std::int64_t>(c10::elementSize(item.dtype)), &bytes) || bytes > stored)
    f.fail(fmt::format("'{}' needs {} bytes for its {} elements, and its items hold {}", item.key,
                       bytes, whole, stored));
}

std::vector<std::variant<std::string, std::int64_t>> path_of(const Pickled* p, const std::string& key, const Fields& f) {
  if (p == nullptr) return {key};
  if (!p->is(Kind::kTuple) && !p->is(Kind::kList)) f.fail(fmt::format("the path of '{}' is {}", key, p->describe()));
  std::vector<std::variant<std::string, std::int64_t>> path;
  for (const auto* part : p->items) {
    if (part->is(Kind::kString)) path.emplace_back(part->text);
    else path.emplace_back(f.integer(*part, "the path of '" + key + "'"));
  }
  return path;
}

}  // namespace

Metadata parse_metadata(const std::string& bytes, const std::string& source) {
  const Unpickled pickle = unpickle(bytes, source);
  const Fields f(source);
  const Pickled& root = pickle.root();
  f.expect_class(root, "Metadata", "its root");
  const Pickled& state_dict = f.field(root, "state_dict_metadata", "Metadata");
  const Pickled& storage = f.field(root, "storage_data", "Metadata");
  const Pickled* planner = root.find("planner_data");
  if (!state_dict.is(Kind::kDict) || !storage.is(Kind::kDict))
    f.fail("its state_dict_metadata or storage_data is not a dict");

  // Where each (key, chunk offsets) lies.
  std::map<std::pair<std::string, std::vector<std::int64_t>>, Chunk> where;
  std::set<std::string> files;
  for (const auto& [index, info] : storage.entries) {
    f.expect_class(*index, "MetadataIndex", "a key of storage_data");
    f.expect_class(*info, "_StorageInfo", "a value of storage_data");
    const std::string& key = f.string(f.field(*index, "fqn", "MetadataIndex"), "MetadataIndex.fqn");
    const Pickled* offset = index->find("offset");
    Chunk chunk;
    if (offset != nullptr && !offset->is(Kind::kNone)) chunk.offsets = f.ints(*offset, "the offset of '" + key + "'");
    chunk.file = f.string(f.field(*info, "relative_path", "_StorageInfo"), "the file of '" + key + "'");
    if (chunk.file.empty() || chunk.file.find('/') != std::string::npos || chunk.file == "." || chunk.file == "..")
      f.fail(fmt::format("'{}' lies in '{}', which is not a file of the checkpoint's directory", key, chunk.file));
    chunk.offset = f.integer(f.field(*info, "offset", "_StorageInfo"), "the offset of '" + key + "'");
    chunk.length = f.integer(f.field(*info, "length", "_StorageInfo"), "the length of '" + key + "'");
    if (chunk.offset < 0 || chunk.length < 0 || chunk.length > INT64_MAX - chunk.offset)
      f.fail(fmt::format("'{}' has a negative or impossible offset or length", key));
    if (const Pickled* transforms = info->find("transform_descriptors");
        transforms != nullptr && !transforms->is(Kind::kNone) && !transforms->items.empty())
      f.fail(fmt::format("'{}' was written through a stream transform ({}), which is not read here; save without "
                         "the extension",
                         key, transforms->describe()));
    files.insert(chunk.file);
    where[{key, chunk.offsets}] = chunk;
  }

  Metadata metadata;
  metadata.files.assign(files.begin(), files.end());
  for (const auto& [k, entry] : state_dict.entries) {
    Item item;
    item.key = f.string(*k, "a key of state_dict_metadata");
    item.path = path_of(planner == nullptr ? nullptr : planner->find(item.key), item.key, f);
    auto locate = [&](Chunk chunk) {
      const auto it = where.find({item.key, chunk.offsets});
      if (it == where.end())
        f.fail(fmt::format("'{}' has a chunk at ({}) that storage_data does not place", item.key,
                           fmt::join(chunk.offsets, ", ")));
      chunk.file = it->second.file;
      chunk.offset = it->second.offset;
      chunk.length = it->second.length;
      return chunk;
    };
    const auto dot = entry->text.rfind('.');
    const std::string cls = entry->text.substr(dot == std::string::npos ? 0 : dot + 1);
    if (entry->is(Kind::kObject) && cls == "BytesStorageMetadata") {
      item.chunks.push_back(locate(Chunk{}));
    } else {
      f.expect_class(*entry, "TensorStorageMetadata", "the entry of '" + item.key + "'");
      item.tensor = true;
      const Pickled& properties = f.field(*entry, "properties", "TensorStorageMetadata");
      f.expect_class(properties, "TensorProperties", "the properties of '" + item.key + "'");
      // Its state is (dtype, layout, requires_grad, memory_format, pin_memory), or
      // a dict with `dtype` from an older PyTorch.
      const Pickled* dtype = properties.find("dtype");
      if (dtype == nullptr && properties.state != nullptr && properties.state->is(Kind::kTuple) &&
          !properties.state->items.empty())
        dtype = properties.state->items[0];
      if (dtype == nullptr) f.fail(fmt::format("the properties of '{}' give no dtype", item.key));
      item.dtype = dtype_of(*dtype, f, item.key);
      item.size = f.ints(f.field(*entry, "size", "TensorStorageMetadata"), "the size of '" + item.key + "'");
      const Pickled& chunks = f.field(*entry, "chunks", "TensorStorageMetadata");
      if (!chunks.is(Kind::kList) || chunks.items.empty()) f.fail(fmt::format("'{}' has no chunks", item.key));
      for (const auto* c : chunks.items) {
        f.expect_class(*c, "ChunkStorageMetadata", "a chunk of '" + item.key + "'");
        Chunk chunk;
        chunk.offsets = f.ints(f.field(*c, "offsets", "ChunkStorageMetadata"), "a chunk of '" + item.key + "'");
        chunk.sizes = f.ints(f.field(*c, "sizes", "ChunkStorageMetadata"), "a chunk of '" + item.key + "'");
        item.chunks.push_back(locate(std::move(chunk)));
      }
      check_tiling(item, f);
    }
    metadata.items.push_back(std::move(item));
  }
  return metadata;
}

std::vector<Entry> read_entries(const Metadata& metadata, const ReadBytes& read, const std::string& source) {
  std::vector<Entry> entries;
  for (const auto& item : metadata.items) {
    auto bytes_of = [&](const Chunk& c) {
      return read(c.file, c.offset, c.length);
    };
    const std::string where = fmt::format("{}: '{}'", source, item.key);
    if (!item.tensor) {
      entries.push_back({item.key, item.path, torch_load_bytes(bytes_of(item.chunks[0]), where)});
      continue;
    }
    auto whole = at::empty(item.size, at::TensorOptions().dtype(item.dtype));
    for (const auto& c : item.chunks) {
      const auto value = torch_load_bytes(bytes_of(c), fmt::format("{} at ({})", where, fmt::join(c.offsets, ", ")));
      if (!value.isTensor() || value.toTensor().sizes() != at::IntArrayRef(c.sizes))
        throw DataError(fmt::format("{}: its chunk at ({}) holds {}, not a tensor of shape [{}]", where,
                                    fmt::join(c.offsets, ", "),
                                    value.isTensor() ? fmt::format("a tensor of shape [{}]", fmt::join(value.toTensor().sizes(), ", "))
                                                     : std::string(value.tagKind()),
                                    fmt::join(c.sizes, ", ")));
      at::Tensor target = whole;
      for (std::size_t d = 0; d < c.offsets.size(); ++d)
        target = target.narrow(static_cast<std::int64_t>(d), c.offsets[d], c.sizes[d]);
      target.copy_(value.toTensor());
    }
    entries.push_back({item.key, item.path, whole});
  }
  return entries;
}

bool is_dcp_directory(const std::string& directory) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(directory) / ".metadata", ec);
}

Metadata read_metadata(const std::string& directory) {
  const std::string path = (fs::path(directory) / ".metadata").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot be read; a distributed checkpoint's directory holds it", path));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_metadata(bytes, path);
}

ReadBytes directory_reader(const std::string& directory) {
  return [directory](const std::string& file, std::int64_t offset, std::int64_t length) {
    const std::string path = (fs::path(directory) / file).string();
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) throw DataError(fmt::format("{}: cannot be read; the checkpoint's metadata names it", path));
    const auto size = static_cast<std::int64_t>(in.tellg());
    if (offset > size || length > size - offset)
      throw DataError(fmt::format("{}: holds {} bytes, and the metadata places an item at bytes {} to {}: the file is "
                                  "truncated",
                                  path, size, offset, offset + length));
    std::string bytes(static_cast<std::size_t>(length), '\0');
    in.seekg(offset);
    in.read(bytes.data(), length);
    if (!in) throw DataError(fmt::format("{}: could not read bytes {} to {}", path, offset, offset + length));
    return bytes;
  };
}

std::vector<Entry> read_checkpoint(const std::string& directory) {
  return read_entries(read_metadata(directory), directory_reader(directory), directory);
}

}  // namespace cohort::checkpoint::dcp
