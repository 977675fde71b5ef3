#include "cohort/checkpoint/consolidate.h"
#include "cohort/checkpoint/consolidate_internal.h"

#include <fmt/format.h>
#include <torch/serialize/input-archive.h>

#include <filesystem>
#include <map>
#include <vector>

#include "cohort/checkpoint/atomic_file.h"
#include "cohort/checkpoint/checkpointer.h"
#include "cohort/checkpoint/checkpointer_internal.h"
#include "cohort/checkpoint/manifest.h"
#include "cohort/checkpoint/torch_format.h"
#include "cohort/checkpoint/trainer_state.h"
#include "cohort/errors.h"

namespace fs = std::filesystem;

namespace cohort::checkpoint {
namespace {

// Note [No floats for Python 1.13]: the safe unpickler of PyTorch 1.13 (Debian 12's)
// has no BINFLOAT, so a float anywhere makes torch.load(weights_only=True) fail
// there. Floats (a learning rate, Adam's betas) are written as 0-d float64 tensors.
c10::IValue for_python(const c10::IValue& value) {
  if (value.isDouble()) return at::scalar_tensor(value.toDouble(), at::kDouble);
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const auto& item : value.toTupleRef().elements()) items.push_back(for_python(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (value.isTensor()) return value.toTensor().detach().cpu();
  return value;
}

// An archive of LibTorch's serialize::OutputArchive as nested dicts by key: each
// sub-archive a dict, each value as written (tensors, numbers, strings, tuples).
GenericDict as_dict(torch::serialize::InputArchive& archive) {
  GenericDict out(c10::StringType::get(), c10::AnyType::get());
  for (const auto& key : archive.keys()) {
    torch::serialize::InputArchive sub;
    if (archive.try_read(key, sub)) {
      out.insert(key, as_dict(sub));
      continue;
    }
    c10::IValue value;
    if (!archive.try_read(key, value)) continue;
    // An undefined tensor (a field the optimizer did not use) says nothing.
    if (value.isTensor() && !value.toTensor().defined()) continue;
    out.insert(key, for_python(value));
  }
  return out;
}

GenericDict sub(const GenericDict& d, const std::string& key, const std::string& source) {
  auto it = d.find(key);
  if (it == d.end() || !it->value().isGenericDict())
    throw DataError(fmt::format("{}: an optimizer state without '{}'", source, key));
  return it->value().toGenericDict();
}

// One optimizer file: its groups' parameter keys in order, their options, and the
// state of each parameter key.
struct OptimizerFile {
  std::vector<std::vector<std::string>> groups;
  std::vector<GenericDict> options;
  GenericDict state{c10::StringType::get(), c10::AnyType::get()};
};

OptimizerFile read_optimizer_file(const std::string& bytes, const std::string& source) {
  OptimizerFile file;
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(bytes.data(), bytes.size());
    const auto root = as_dict(archive);
    file.state = sub(root, "state", source);
    const auto groups = sub(root, "param_groups", source);
    for (std::int64_t g = 0;; ++g) {
      auto it = groups.find("param_groups/" + std::to_string(g));
      if (it == groups.end()) break;
      const auto group = it->value().toGenericDict();
      std::vector<std::string> keys;
      for (std::int64_t j = 0;; ++j) {
        auto key = group.find("params/" + std::to_string(j));
        if (key == group.end()) break;
        keys.push_back(key->value().toStringRef());
      }
      file.groups.push_back(std::move(keys));
      file.options.push_back(sub(group, "options", source));
    }
  } catch (const DataError&) {
    throw;
  } catch (const std::exception& e) {
    throw DataError(fmt::format("{}: cannot be read as an optimizer state ({}); it is corrupt", source, e.what()));
  }
  return file;
}

// The newest step directory of `directory` whose files all pass their manifest,
// by step number, checked as Checkpointer::load_latest checks them.
std::string newest_complete(const std::string& directory, std::ostream& log) {
  const Checkpointer steps(directory, comm::Group());
  const auto on_disk = steps.steps_on_disk();
  for (auto it = on_disk.rbegin(); it != on_disk.rend(); ++it) {
    const std::string path = steps.path_of(*it);
    try {
      if (is_foreign_dcp(path)) verify_foreign_dcp(path);  // PyTorch's dcp.save wrote it
      else verify_checkpoint(path, *it);
      return path;
    } catch (const DataError& e) {
      log << fmt::format("cohort checkpoint: skipping {}: {}\n", path, e.what());
    }
  }
  throw DataError(fmt::format("{} holds no complete checkpoint (no step-N directory whose files pass their "
                              "manifest)",
                              directory));
}

}  // namespace

GenericDict consolidated_state(const std::string& source, std::ostream& log, Consolidated& report) {
  std::error_code ec;
  if (!fs::is_directory(source, ec))
    throw DataError(fmt::format("{} is not a directory; give a checkpoint (step-N) or a directory of them", source));
  report.checkpoint = fs::exists(fs::path(source) / kManifestName) || is_foreign_dcp(source)
                          ? source
                          : newest_complete(source, log);
  const std::string& path = report.checkpoint;
  // In PyTorch's format (Note [Checkpoints in PyTorch's format]): read whole.
  const bool foreign = is_foreign_dcp(path);
  const auto manifest = foreign ? Manifest{} : read_manifest(path);
  if (foreign || manifest.files.count(".metadata") != 0) {
    const auto dcp = read_dcp_checkpoint(path, foreign ? nullptr : &manifest, foreign ? -1 : manifest.step);
    report.step = dcp.trainer.progress.step;
    auto result = whole_state(dcp.model, dcp.optimizer, report.step, dcp.trainer.progress.epoch, path);
    const auto optimizer = result.at("optimizer").toGenericDict();
    report.shards = dcp.optimizer.empty() ? 0 : 1;
    for (const auto& group : optimizer.at("param_groups").toList())
      report.parameters += static_cast<std::int64_t>(group.get().toGenericDict().at("params").toList().size());
    report.with_state = static_cast<std::int64_t>(optimizer.at("state").toGenericDict().size());
    return result;
  }
  report.step = manifest.step;

  GenericDict result(c10::StringType::get(), c10::AnyType::get());
  result.insert("model", torch_load_bytes(read_listed(path, manifest, "model.pt"), path + "/model.pt"));
  const auto trainer = decode_trainer_state(read_listed(path, manifest, "trainer.pt"), path + "/trainer.pt");
  result.insert("step", trainer.progress.step);
  result.insert("epoch", trainer.progress.epoch);

  // Which optimizer file holds parameter i: the shards by the layout, or optimizer.pt.
  std::vector<std::string> files;
  std::vector<std::vector<std::int64_t>> indices;  // per file, its parameters' global indices in order
  if (manifest.shards) {
    files = manifest.shards->files;
    indices.resize(files.size());
    const auto& owner = manifest.shards->layout.owner;
    for (std::size_t i = 0; i < owner.size(); ++i)
      indices[static_cast<std::size_t>(owner[i])].push_back(static_cast<std::int64_t>(i));
    report.parameters = static_cast<std::int64_t>(owner.size());
  } else {
    files = {"optimizer.pt"};
    indices.resize(1);  // filled from the file's own groups below
  }

  GenericDict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  for (std::size_t f = 0; f < files.size(); ++f) {
    const std::string where = path + "/" + files[f];
    const std::string bytes = read_listed(path, manifest, files[f]);
    if (bytes.empty()) continue;  // a rank that owned no parameter
    const auto file = read_optimizer_file(bytes, where);
    ++report.shards;
    std::vector<std::string> keys;
    for (const auto& g : file.groups) keys.insert(keys.end(), g.begin(), g.end());
    if (!manifest.shards) {
      for (std::size_t j = 0; j < keys.size(); ++j) indices[0].push_back(static_cast<std::int64_t>(j));
      report.parameters = static_cast<std::int64_t>(keys.size());
    }
    if (keys.size() != indices[f].size())
      throw DataError(fmt::format("{} holds {} parameters and the manifest gives it {}", where, keys.size(),
                                  indices[f].size()));
    for (std::size_t j = 0; j < keys.size(); ++j) {
      auto it = file.state.find(keys[j]);
      if (it != file.state.end()) state.insert(indices[f][j], it->value());
    }
    // The groups' options, once: every shard holds the same (one group under ZeRO).
    if (groups.empty()) {
      std::int64_t next = 0;
      for (std::size_t g = 0; g < file.groups.size(); ++g) {
        auto group = file.options[g].copy();
        // A list of Any: a List[int] pickles as build_intlist, which the safe loader refuses.
        c10::impl::GenericList params(c10::AnyType::get());
        const auto count = manifest.shards ? report.parameters : static_cast<std::int64_t>(file.groups[g].size());
        for (std::int64_t k = 0; k < count; ++k) params.push_back(c10::IValue(next++));
        group.insert("params", params);
        groups.push_back(group);
      }
    }
  }
  report.with_state = static_cast<std::int64_t>(state.size());
  GenericDict optimizer(c10::StringType::get(), c10::AnyType::get());
  optimizer.insert("state", state);
  optimizer.insert("param_groups", groups);
  result.insert("optimizer", optimizer);
  return result;
}

GenericDict whole_state(const std::string& model_bytes, const std::string& optimizer_bytes, std::int64_t step,
                        std::int64_t epoch, const std::string& source) {
  GenericDict result(c10::StringType::get(), c10::AnyType::get());
  result.insert("model", torch_load_bytes(model_bytes, source + "/model.pt"));
  result.insert("step", step);
  result.insert("epoch", epoch);
  // A checkpoint without an optimizer (PyTorch's, of a model alone) has no groups.
  const auto file = optimizer_bytes.empty() ? OptimizerFile{} : read_optimizer_file(optimizer_bytes, source + "/optimizer.pt");
  GenericDict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  std::int64_t next = 0;  // parameter i of the optimizer, over its groups in order
  for (std::size_t g = 0; g < file.groups.size(); ++g) {
    auto group = file.options[g].copy();
    c10::impl::GenericList params(c10::AnyType::get());
    for (const auto& key : file.groups[g]) {
      if (auto it = file.state.find(key); it != file.state.end()) state.insert(next, it->value());
      params.push_back(c10::IValue(next++));
    }
    group.insert("params", params);
    groups.push_back(group);
  }
  GenericDict optimizer(c10::StringType::get(), c10::AnyType::get());
  optimizer.insert("state", state);
  optimizer.insert("param_groups", groups);
  result.insert("optimizer", optimizer);
  return result;
}

Consolidated consolidate_checkpoint(const std::string& source, const std::string& out, std::ostream& log) {
  Consolidated report;
  const auto result = consolidated_state(source, log, report);
  if (fs::weakly_canonical(fs::absolute(out)).parent_path() == fs::weakly_canonical(fs::absolute(report.checkpoint)))
    throw DataError(fmt::format("{} would be written into the checkpoint {} it is made from; write it elsewhere",
                                out, report.checkpoint));
  const std::string bytes = torch_save_bytes(result);
  write_file_atomically(out, bytes);
  report.bytes = bytes.size();
  return report;
}

}  // namespace cohort::checkpoint
