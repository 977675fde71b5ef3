#include "cohort/checkpoint/dcp/writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "cohort/checkpoint/atomic_file.h"
#include "cohort/checkpoint/dcp/pickle_value.h"
#include "cohort/checkpoint/torch_format.h"
#include "cohort/errors.h"

namespace fs = std::filesystem;

namespace cohort::checkpoint::dcp {
namespace {

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr const char* kFilesystemModule = "torch.distributed.checkpoint.filesystem";

std::string dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default:
      throw ConfigError(fmt::format("a tensor of {} has no name in PyTorch's distributed checkpoints here; "
                                    "convert it to a float or integer type first",
                                    c10::toString(type)));
  }
}

PyValue size_of(at::IntArrayRef dims) {
  std::vector<PyValue> items;
  for (auto d : dims) items.push_back(PyValue::integer(d));
  return PyValue::call("torch", "Size", {PyValue::tuple(std::move(items))});
}

// TensorStorageMetadata of a whole tensor: one chunk at the origin.
PyValue tensor_metadata(const at::Tensor& t) {
  auto properties = PyValue::object(
      kMetadataModule, "TensorProperties",
      {PyValue::tuple({PyValue::global("torch", dtype_name(t.scalar_type())), PyValue::global("torch", "strided"),
                       PyValue::boolean(false),
                       PyValue::call(kMetadataModule, "_MEM_FORMAT_ENCODING", {PyValue::integer(0)}),
                       PyValue::boolean(false)})});
  const std::vector<std::int64_t> origin(t.dim(), 0);
  auto chunk = PyValue::object(
      kMetadataModule, "ChunkStorageMetadata",
      {PyValue::dict({{PyValue::string("offsets"), size_of(origin)}, {PyValue::string("sizes"), size_of(t.sizes())}})});
  return PyValue::object(kMetadataModule, "TensorStorageMetadata",
                         {PyValue::dict({{PyValue::string("properties"), std::move(properties)},
                                         {PyValue::string("size"), size_of(t.sizes())},
                                         {PyValue::string("chunks"), PyValue::list({std::move(chunk)})}})});
}

PyValue path_tuple(const Entry& e) {
  std::vector<PyValue> items;
  for (const auto& part : e.path) {
    if (const auto* s = std::get_if<std::string>(&part)) items.push_back(PyValue::string(*s));
    else items.push_back(PyValue::integer(std::get<std::int64_t>(part)));
  }
  return PyValue::tuple(std::move(items));
}

// A plain value DCP stores as bytes: what LibTorch's unpickler reads back too.
void check_plain(const c10::IValue& v, const std::string& key) {
  if (v.isNone() || v.isBool() || v.isInt() || v.isDouble() || v.isString()) return;
  if (v.isTuple()) {
    for (const auto& item : v.toTupleRef().elements()) check_plain(item, key);
    return;
  }
  if (v.isList()) {
    for (const auto& item : v.toListRef()) check_plain(item, key);
    return;
  }
  throw ConfigError(fmt::format("'{}' holds a {}, which a distributed checkpoint does not hold here; give a "
                                "tensor, a number, a bool, None, a string, or a tuple or list of those",
                                key, v.tagKind()));
}

}  // namespace

Encoded encode_checkpoint(const std::vector<Entry>& entries) {
  std::set<std::string> seen;
  for (const auto& e : entries)
    if (!seen.insert(e.key).second) throw ConfigError(fmt::format("the key '{}' is given twice", e.key));

  // The data file: the plain values first, then the tensors, each a whole torch.save
  // archive (docs/dcp_format.md, ".distcp: the items").
  Written written;
  std::string data;
  std::vector<std::pair<PyValue, PyValue>> state_dict_metadata, planner_data, storage_data;
  auto storage_info = [&](const std::string& item) {
    const auto offset = static_cast<std::int64_t>(data.size());
    data += item;
    return PyValue::object(kFilesystemModule, "_StorageInfo",
                           {PyValue::dict({{PyValue::string("relative_path"), PyValue::string(kDataFile)},
                                           {PyValue::string("offset"), PyValue::integer(offset)},
                                           {PyValue::string("length"),
                                            PyValue::integer(static_cast<std::int64_t>(item.size()))}})});
  };
  for (const bool tensors : {false, true}) {
    for (const auto& e : entries) {
      if (e.value.isTensor() != tensors) continue;
      planner_data.emplace_back(PyValue::string(e.key), path_tuple(e));
      if (!tensors) {
        check_plain(e.value, e.key);
        state_dict_metadata.emplace_back(PyValue::string(e.key), PyValue::object(kMetadataModule, "BytesStorageMetadata"));
        auto index = PyValue::object(kMetadataModule, "MetadataIndex",
                                     {PyValue::dict({{PyValue::string("fqn"), PyValue::string(e.key)}})});
        storage_data.emplace_back(std::move(index), storage_info(torch_save_bytes(e.value)));
        ++written.values;
        continue;
      }
      // A copy that owns exactly its elements, on the CPU, contiguous.
      const auto t = e.value.toTensor().detach().to(at::kCPU).contiguous().clone();
      state_dict_metadata.emplace_back(PyValue::string(e.key), tensor_metadata(t));
      const std::vector<std::int64_t> origin(t.dim(), 0);
      auto index = PyValue::object(kMetadataModule, "MetadataIndex",
                                   {PyValue::dict({{PyValue::string("fqn"), PyValue::string(e.key)},
                                                   {PyValue::string("offset"), size_of(origin)},
                                                   {PyValue::string("index"), PyValue::integer(0)}})});
      storage_data.emplace_back(std::move(index), storage_info(torch_save_bytes(t)));
      ++written.tensors;
    }
  }
  const auto root = PyValue::object(
      kMetadataModule, "Metadata",
      {PyValue::dict({{PyValue::string("state_dict_metadata"), PyValue::dict(std::move(state_dict_metadata))},
                      {PyValue::string("planner_data"), PyValue::dict(std::move(planner_data))},
                      {PyValue::string("storage_data"), PyValue::dict(std::move(storage_data))},
                      {PyValue::string("storage_meta"), PyValue::none()},
                      {PyValue::string("version"), PyValue::string("1.0.0")}})});

  written.bytes = data.size();
  return {std::move(data), root.pickle(), written};
}

Written write_checkpoint(const std::string& out, const std::vector<Entry>& entries) {
  std::error_code ec;
  if (fs::exists(out, ec))
    throw ConfigError(fmt::format("{} exists; a distributed checkpoint is written into a new directory", out));
  const Encoded encoded = encode_checkpoint(entries);
  // Note [Atomic replace], for a directory: written whole under a temporary name,
  // then renamed into place; .metadata last, as dcp.save does.
  const fs::path target = fs::absolute(out).lexically_normal();
  const std::string parent = target.parent_path().string();
  const std::string temp = (target.parent_path() / fmt::format("{}{}.{}", kTempPrefix, target.filename().string(),
                                                               ::getpid()))
                               .string();
  try {
    fs::create_directories(parent);
    fs::remove_all(temp);
    fs::create_directory(temp);
    write_file_durably(temp + "/" + kDataFile, encoded.data);
    write_file_durably(temp + "/" + kMetadataFile, encoded.metadata);
    fsync_directory(temp);
    fs::rename(temp, target);
    fsync_directory(parent);
  } catch (const std::exception& e) {
    fs::remove_all(temp, ec);
    throw Error(fmt::format("could not write the distributed checkpoint {}: {}", out, e.what()));
  }
  return encoded.written;
}

}  // namespace cohort::checkpoint::dcp
