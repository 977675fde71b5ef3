// `cohort checkpoint inspect DIR`: what a checkpoint holds, in cohort's format or in
// PyTorch's distributed checkpoint format (cohort's Format::kDcp, or dcp.save's own).
#include "checkpoint_inspect.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <sstream>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/checkpoint/consolidate_internal.h"
#include "cohort/checkpoint/dcp/reader.h"
#include "cohort/checkpoint/manifest.h"
#include "cohort/checkpoint/torch_format.h"
#include "cohort/checkpoint/trainer_state.h"
#include "cohort/errors.h"

namespace fs = std::filesystem;

namespace cohort::tools {
namespace {

std::string shape(at::IntArrayRef sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

std::string value_text(const c10::IValue& v) {
  std::ostringstream s;
  if (v.isTensor() && v.toTensor().dim() == 0) s << v.toTensor().item<double>();
  else s << v;
  return s.str();
}

// The step directories of `dir`, newest first, with what each is.
void list_steps(const std::string& dir, std::ostream& out) {
  const checkpoint::Checkpointer steps(dir, comm::Group());
  const auto on_disk = steps.steps_on_disk();
  out << fmt::format("{}: {} checkpoint(s)\n", dir, on_disk.size());
  for (auto it = on_disk.rbegin(); it != on_disk.rend(); ++it) {
    const std::string path = steps.path_of(*it);
    const bool manifest = fs::exists(fs::path(path) / checkpoint::kManifestName);
    const bool dcp = checkpoint::dcp::is_dcp_directory(path);
    std::string status = "complete";
    try {
      if (manifest) checkpoint::verify_checkpoint(path, *it);
      else if (dcp) checkpoint::dcp::read_metadata(path);
      else status = "incomplete (no manifest)";
    } catch (const Error& e) {
      status = std::string("damaged: ") + e.what();
    }
    out << fmt::format("  step {}: {} ({}), {}\n", *it, fs::path(path).filename().string(),
                       !dcp ? "cohort" : manifest ? "PyTorch's format, by cohort" : "PyTorch's format, by PyTorch",
                       status);
  }
}

void inspect_dcp(const std::string& path, std::ostream& out) {
  const bool by_cohort = fs::exists(fs::path(path) / checkpoint::kManifestName);
  if (by_cohort) checkpoint::verify_checkpoint(path);
  const auto metadata = checkpoint::dcp::read_metadata(path);
  std::vector<std::string> files;
  for (const auto& f : metadata.files) files.push_back(fmt::format("{} ({} bytes)", f, fs::file_size(fs::path(path) / f)));
  std::int64_t tensors = 0;
  for (const auto& item : metadata.items) tensors += item.tensor ? 1 : 0;
  out << fmt::format("{}: a PyTorch distributed checkpoint, written by {}; {} tensors, {} values\n", path,
                     by_cohort ? "cohort (Format::kDcp; its files pass MANIFEST.json)" : "PyTorch",
                     tensors, metadata.items.size() - static_cast<std::size_t>(tensors));
  out << fmt::format("  data files: {}\n", fmt::join(files, ", "));
  const auto read = checkpoint::dcp::directory_reader(path);
  for (const auto& item : metadata.items) {
    if (item.tensor) {
      out << fmt::format("  {}  {} {}{}\n", item.key, c10::toString(item.dtype), shape(item.size),
                         item.chunks.size() > 1 ? fmt::format(" in {} chunks", item.chunks.size()) : "");
    } else {
      const auto& c = item.chunks[0];
      const auto value = checkpoint::torch_load_bytes(read(c.file, c.offset, c.length), path + ": " + item.key);
      out << fmt::format("  {} = {}\n", item.key, value_text(value));
    }
  }
}

void inspect_cohort(const std::string& path, std::ostream& out, std::ostream& err) {
  checkpoint::Consolidated report;
  const auto state = checkpoint::consolidated_state(path, err, report);
  const auto manifest = checkpoint::read_manifest(report.checkpoint);
  const auto trainer = checkpoint::decode_trainer_state(
      checkpoint::read_listed(report.checkpoint, manifest, "trainer.pt"), report.checkpoint + "/trainer.pt");
  std::vector<std::string> files;
  for (const auto& [name, entry] : manifest.files) files.push_back(fmt::format("{} ({} bytes)", name, entry.bytes));
  out << fmt::format("{}: a cohort checkpoint of step {}, epoch {}; its files pass MANIFEST.json\n",
                     report.checkpoint, trainer.progress.step, trainer.progress.epoch);
  out << fmt::format("  files: {}\n", fmt::join(files, ", "));
  out << fmt::format("  optimizer: {}, {} of {} parameters with a state\n",
                     manifest.shards ? fmt::format("in {} shards (ZeRO, saved by {} ranks)", manifest.shards->files.size(),
                                                   manifest.shards->layout.world_size)
                                     : std::string("whole"),
                     report.with_state, report.parameters);
  out << fmt::format("  trainer: generators of {} rank(s), {}\n", trainer.rng.size(),
                     trainer.progress.sampler ? "a sampler position" : "no sampler position");
  for (const auto& item : state.at("model").toGenericDict()) {
    const auto& t = item.value().toTensor();
    out << fmt::format("  model.{}  {} {}\n", item.key().toStringRef(), c10::toString(t.scalar_type()),
                       shape(t.sizes()));
  }
  std::int64_t g = 0;
  for (const auto& group : state.at("optimizer").toGenericDict().at("param_groups").toList()) {
    for (const auto& option : group.get().toGenericDict()) {
      if (option.key().toStringRef() == "params") continue;
      out << fmt::format("  optimizer.param_groups.{}.{} = {}\n", g, option.key().toStringRef(),
                         value_text(option.value()));
    }
    ++g;
  }
}

}  // namespace

int inspect_checkpoint(const std::string& dir, std::ostream& out, std::ostream& err) {
  try {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      err << "cohort checkpoint inspect: " << dir << " is not a directory; give a checkpoint (step-N) or a "
          << "directory of them\n";
      return 1;
    }
    std::string path = dir;
    const bool one = fs::exists(fs::path(dir) / checkpoint::kManifestName) || checkpoint::dcp::is_dcp_directory(dir);
    if (!one) {
      list_steps(dir, out);
      const checkpoint::Checkpointer steps(dir, comm::Group());
      const auto on_disk = steps.steps_on_disk();
      if (on_disk.empty()) return 1;
      path = steps.path_of(on_disk.back());
      out << "the newest:\n";
    }
    if (checkpoint::dcp::is_dcp_directory(path)) inspect_dcp(path, out);
    else inspect_cohort(path, out, err);
    return 0;
  } catch (const Error& e) {
    err << "cohort checkpoint inspect: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace cohort::tools
