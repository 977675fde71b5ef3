// Checkpointer's checkpoints in PyTorch's distributed checkpoint format: writing
// Format::kDcp, and reading those and the ones PyTorch's dcp.save wrote.
#include <fmt/format.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "cohort/checkpoint/checkpointer_internal.h"
#include "cohort/checkpoint/consolidate_internal.h"
#include "cohort/checkpoint/dcp/convert.h"
#include "cohort/checkpoint/dcp/reader.h"
#include "cohort/checkpoint/dcp/to_cohort.h"
#include "cohort/checkpoint/torch_format.h"
#include "cohort/errors.h"

namespace fs = std::filesystem;

namespace cohort::checkpoint {

// Note [Checkpoints in PyTorch's format]
// A Format::kDcp checkpoint is a step-N directory like any other (written under a
// temporary name, renamed into place, MANIFEST.json last with every file's CRC-32),
// whose model and optimizer are PyTorch's .metadata and __0_0.distcp instead of
// model.pt and optimizer.pt: dcp.load reads the directory at any world size, and
// ignores trainer.pt and the manifest. It is made from the bytes a Format::kCohort
// save makes (on the writer thread when asynchronous): whole tensors, so one writer.
//
// load_latest reads three kinds of step-N: cohort's own, cohort's in PyTorch's
// format (the manifest lists .metadata), and one that PyTorch's dcp.save wrote into
// step-N (torchtitan's layout: .metadata, no manifest). The last two are read into
// the model.pt and optimizer.pt bytes of a whole checkpoint (dcp/to_cohort.h), so
// that every layout loads them as it loads a whole checkpoint: resharded to ZeRO,
// split for tensor parallelism. PyTorch's own has no manifest: its completeness is
// its .metadata, written last by dcp.save, and every item must lie inside its file.
// It holds no generator or sampler state, so those start afresh.

const std::vector<std::string>& whole_files(Format format) {
  static const std::vector<std::string> cohort = {"model.pt", "optimizer.pt", "trainer.pt"};
  static const std::vector<std::string> pytorch = {dcp::kDataFile, dcp::kMetadataFile, "trainer.pt"};
  return format == Format::kDcp ? pytorch : cohort;
}

std::string dcp_kind_of(const torch::optim::Optimizer& optimizer, const std::string& given) {
  if (!given.empty()) return given;
  // AdamW first: cohort's optimizers may derive from LibTorch's.
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr) return "adamw";
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer) != nullptr) return "adam";
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr) return "sgd";
  // A wrapper (ZeRO) may still hold its inner optimizer's options.
  if (!optimizer.param_groups().empty() && optimizer.param_groups()[0].has_options()) {
    const auto& options = optimizer.param_groups()[0].options();
    if (dynamic_cast<const torch::optim::AdamWOptions*>(&options) != nullptr) return "adamw";
    if (dynamic_cast<const torch::optim::AdamOptions*>(&options) != nullptr) return "adam";
    if (dynamic_cast<const torch::optim::SGDOptions*>(&options) != nullptr) return "sgd";
  }
  return "";
}

std::vector<std::string> as_dcp_contents(const std::string& model, const std::string& optimizer,
                                         const std::string& trainer, std::int64_t step, std::int64_t epoch,
                                         const std::string& kind, const std::string& path) {
  const auto state = whole_state(model, optimizer, step, epoch, path);
  std::string given = kind;
  if (given.empty()) {  // Adam and AdamW look alike in LibTorch's files; sgd is recognised
    const auto groups = state.at("optimizer").toGenericDict().at("param_groups").toList();
    if (!groups.empty() && groups.get(0).toGenericDict().contains("betas")) given = "adam";
  }
  std::string chosen;
  auto encoded = dcp::encode_checkpoint(dcp::entries_of_state(state, given, path, chosen));
  return {std::move(encoded.data), std::move(encoded.metadata), trainer};
}

bool is_foreign_dcp(const std::string& path) {
  std::error_code ec;
  return !fs::exists(fs::path(path) / kManifestName, ec) && dcp::is_dcp_directory(path);
}

void verify_foreign_dcp(const std::string& path) {
  const auto metadata = dcp::read_metadata(path);
  std::map<std::string, std::int64_t> needed;  // file -> the end of its last item
  for (const auto& item : metadata.items)
    for (const auto& c : item.chunks) needed[c.file] = std::max(needed[c.file], c.offset + c.length);
  for (const auto& [file, end] : needed) {
    std::error_code ec;
    const auto size = fs::file_size(fs::path(path) / file, ec);
    if (ec) throw DataError(fmt::format("{}/{}: its metadata names it, and it cannot be read ({})", path, file, ec.message()));
    if (static_cast<std::int64_t>(size) < end)
      throw DataError(fmt::format("{}/{}: holds {} bytes, and its metadata places items up to byte {}: it is truncated",
                                  path, file, size, end));
  }
}

DcpLoad read_dcp_checkpoint(const std::string& path, const Manifest* manifest, std::int64_t step) {
  const std::string metadata_path = path + "/" + dcp::kMetadataFile;
  dcp::Metadata metadata;
  dcp::ReadBytes read;
  std::map<std::string, std::string> files;  // the manifest's files, each read and checked once
  if (manifest != nullptr) {
    metadata = dcp::parse_metadata(read_listed(path, *manifest, dcp::kMetadataFile), metadata_path);
    read = [&](const std::string& file, std::int64_t offset, std::int64_t length) {
      auto it = files.find(file);
      if (it == files.end()) it = files.emplace(file, read_listed(path, *manifest, file)).first;
      const auto size = static_cast<std::int64_t>(it->second.size());
      if (offset > size || length > size - offset)
        throw DataError(fmt::format("{}/{}: holds {} bytes, and the metadata places an item at bytes {} to {}", path,
                                    file, it->second.size(), offset, offset + length));
      return it->second.substr(static_cast<std::size_t>(offset), static_cast<std::size_t>(length));
    };
  } else {
    metadata = dcp::read_metadata(path);
    read = dcp::directory_reader(path);
  }
  const auto state = dcp::to_cohort(dcp::read_entries(metadata, read, path), path);
  DcpLoad out;
  out.model = torch_save_bytes(state.model);
  out.optimizer = state.optimizer_bytes;
  out.ignored = state.ignored;
  if (manifest != nullptr && manifest->files.count("trainer.pt") != 0) {
    out.trainer = decode_trainer_state(read_listed(path, *manifest, "trainer.pt"), path + "/trainer.pt");
    out.has_trainer = true;
  } else {
    // The directory's name says it, as torchtitan names them (-1: not known).
    out.trainer.progress.step = step >= 0 ? step : state.step.value_or(0);
    out.trainer.progress.epoch = state.epoch.value_or(0);
  }
  return out;
}

}  // namespace cohort::checkpoint
