// Checkpointer's directory on disk: the step-N directories, writing one under a
// temporary name and installing it, refusing older steps, pruning, and choosing
// the newest good one to load. Saving is in checkpointer_save.cpp, loading in
// checkpointer_load.cpp.
#include "cohort/checkpoint/checkpointer.h"

#include <fmt/format.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "cohort/checkpoint/async_save_internal.h"
#include "cohort/checkpoint/atomic_file.h"
#include "cohort/checkpoint/checkpointer_internal.h"
#include "cohort/checkpoint/manifest.h"
#include "cohort/errors.h"

namespace fs = std::filesystem;

namespace cohort::checkpoint {
namespace {

constexpr const char* kStepPrefix = "step-";
constexpr const char* kCorruptPrefix = "corrupt-";

std::optional<std::int64_t> step_of(const std::string& name) {
  if (name.rfind(kStepPrefix, 0) != 0) return std::nullopt;
  const std::string digits = name.substr(std::string(kStepPrefix).size());
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) {
    return std::nullopt;  // not ours (18 digits always fit in an int64)
  }
  return std::stoll(digits);
}

}  // namespace

Checkpointer::Checkpointer(std::string directory, comm::Group group, CheckpointerOptions options)
    : directory_(std::move(directory)), group_(std::move(group)), options_(std::move(options)) {
  if (options_.keep_last() < 1) {
    throw ConfigError(fmt::format("CheckpointerOptions::keep_last is {}; it must be at least 1",
                                  options_.keep_last()));
  }
  if (options_.asynchronous() && options_.shard_optimizer_state()) {
    throw ConfigError("CheckpointerOptions: asynchronous(true) with shard_optimizer_state(true) is not supported "
                      "yet: every rank writes its own shard, and the commit waits for all of them. Leave "
                      "shard_optimizer_state off (the state is gathered to rank 0, which writes it "
                      "asynchronously), or save synchronously");
  }
  if (options_.format() == Format::kDcp && options_.shard_optimizer_state()) {
    throw ConfigError("CheckpointerOptions: format(Format::kDcp) with shard_optimizer_state(true) is not supported "
                      "yet: a checkpoint in PyTorch's format is written by rank 0 with every tensor whole. Leave "
                      "shard_optimizer_state off (the state is gathered to rank 0), or keep Format::kCohort");
  }
  if (!options_.dcp_optimizer().empty() && options_.dcp_optimizer() != "adam" && options_.dcp_optimizer() != "adamw" &&
      options_.dcp_optimizer() != "sgd") {
    throw ConfigError(fmt::format("CheckpointerOptions::dcp_optimizer is '{}'; give adam, adamw or sgd",
                                  options_.dcp_optimizer()));
  }
  if (options_.asynchronous()) async_ = std::make_unique<AsyncSave>();
}

Checkpointer::~Checkpointer() {
  if (!async_) return;
  async_->settle();
  if (auto failure = async_->take_failure()) warn(*failure + " (reported when the checkpointer was destroyed)");
}

// The writer thread holds `this`: a move waits for it first.
Checkpointer::Checkpointer(Checkpointer&& other) noexcept
    : directory_(std::move(other.directory_)),
      group_(std::move(other.group_)),
      options_(std::move(other.options_)),
      async_((other.settle_writes(), std::move(other.async_))) {}

void Checkpointer::settle_writes() const {
  if (async_) async_->settle();
}

std::optional<std::string> Checkpointer::write_failure() const {
  return async_ ? async_->failure() : std::nullopt;
}

AsyncStats Checkpointer::async_stats() const {
  return async_ ? async_->stats() : AsyncStats{};
}

void Checkpointer::wait(c10::Device device) {
  if (!async_) return;
  std::string failure;
  if (group_.rank() == 0) {
    async_->settle();
    failure = async_->take_failure().value_or("");
  }
  if (any_rank(group_, !failure.empty(), device)) {
    throw Error(group_.rank() == 0 ? failure
                                   : "rank 0's asynchronous write of a checkpoint failed; its log says why");
  }
}

std::string Checkpointer::path_of(std::int64_t step) const {
  std::string padded = fmt::format("{}/{}{:09d}", directory_, kStepPrefix, step);
  // PyTorch's step-N directories (torchtitan's layout) are not padded.
  std::error_code ec;
  if (!fs::exists(padded, ec)) {
    std::string plain = fmt::format("{}/{}{}", directory_, kStepPrefix, step);
    if (fs::exists(plain, ec)) return plain;
  }
  return padded;
}

void Checkpointer::warn(const std::string& message) const {
  if (options_.warn()) {
    options_.warn()(message);
  } else {
    std::cerr << "cohort: warning: " << message << std::endl;
  }
}

std::vector<std::int64_t> Checkpointer::steps_on_disk() const {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  fs::directory_iterator it(directory_, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    // An unreadable directory must not look like "no checkpoints, start afresh".
    throw Error(fmt::format("cannot list the checkpoint directory {}: {}", directory_, ec.message()));
  }
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (auto step = step_of(it->path().filename().string())) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// Note [Never older than the newest]
// Pruning keeps the newest keep_last checkpoints by step. A save whose step is below a
// checkpoint already on disk would either be pruned at once (the newer ones outrank
// it) or, if the newer ones were removed to make room, destroy work the user may
// want: a run whose step counter restarted, or one that saves "best" checkpoints
// into the same directory. Neither is silent: such a save is refused on every rank,
// and nothing on disk changes. A newer checkpoint that load_latest found corrupt
// does not count: it was moved aside to corrupt-step-N when it was skipped.
std::string Checkpointer::refusal(std::int64_t step) const {
  const auto steps = steps_on_disk();
  if (steps.empty() || steps.back() <= step) return {};
  return fmt::format(
      "refusing to save the checkpoint of step {} into {}: it already holds {}, a newer step, "
      "and pruning keeps the newest {}; nothing was written or removed. Resume with "
      "Checkpointer::load_latest (it continues from step {}), save into another directory "
      "(one per run, or one for best-so-far checkpoints), or move the newer checkpoints away",
      step, directory_, path_of(steps.back()), options_.keep_last(), steps.back());
}

void Checkpointer::write(const std::string& final_path, const std::vector<std::string>& files,
                         const std::vector<std::string>& contents) const {
  const std::string temp = make_temp_directory(final_path);
  for (std::size_t i = 0; i < files.size(); ++i) write_file_durably(temp + "/" + files[i], contents[i]);
  if (options_.before_manifest()) options_.before_manifest()(temp);
  // The manifest last: a directory with a manifest has every file it lists.
  write_file_durably(temp + "/" + kManifestName,
                     manifest_json(*step_of(fs::path(final_path).filename().string()), files, contents));
  fsync_directory(temp);
  install(temp, final_path);
}

// The temporary directory of `final_path` that process `id` makes.
std::string Checkpointer::temp_name(const std::string& final_path, long id) const {
  return fmt::format("{}/{}{}.{}", directory_, kTempPrefix, fs::path(final_path).filename().string(), id);
}

// Makes this process's temporary directory of `final_path`, empty.
std::string Checkpointer::make_temp_directory(const std::string& final_path) const {
  const std::string temp = temp_name(final_path, ::getpid());
  if (!fs::exists(directory_)) {
    fs::create_directories(directory_);
    fsync_directory(parent_directory(fs::absolute(directory_).lexically_normal().string()));
  }
  fs::remove_all(temp);
  fs::create_directory(temp);
  return temp;
}

void Checkpointer::install(const std::string& temp, const std::string& final_path) const {
  // Saving a step that exists replaces it. rename(2) cannot replace a non-empty
  // directory, so the two are swapped in one atomic step and the old one, now under
  // the temporary name, is removed: at every instant a complete step-N exists.
  if (fs::exists(final_path)) {
    if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) != 0) {
      throw Error(fmt::format("renameat2 {} and {}: {}", temp, final_path, std::strerror(errno)));
    }
    fsync_directory(directory_);
    fs::remove_all(temp);
  } else {
    fs::rename(temp, final_path);
  }
  fsync_directory(directory_);
}

void Checkpointer::prune_or_warn() const {
  try {
    prune();
  } catch (const std::exception& e) {
    // The checkpoint is durable; failing to remove old ones must not stop training.
    warn(fmt::format("could not remove old checkpoints in {}: {}", directory_, e.what()));
  }
}

void Checkpointer::prune() const {
  // Nothing on disk is newer than the step just written (Note [Never older than the
  // newest]), so the newest keep_last include it.
  const auto kept = steps_on_disk();
  const auto keep = static_cast<std::size_t>(options_.keep_last());
  for (std::size_t i = 0; i + keep < kept.size(); ++i) fs::remove_all(path_of(kept[i]));
  // Leftovers of a writer that died mid-save (rank 0 is the only writer, and saves
  // one at a time).
  for (const auto& entry : fs::directory_iterator(directory_)) {
    if (entry.path().filename().string().rfind(kTempPrefix, 0) == 0) fs::remove_all(entry.path());
  }
  fsync_directory(directory_);
}

std::optional<std::int64_t> Checkpointer::newest_good_step(std::optional<std::int64_t> at_most) const {
  auto steps = steps_on_disk();
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (at_most && *it > *at_most) {
      const fs::path from = path_of(*it);
      fs::path to = fs::path(directory_) / ("unmatched-" + from.filename().string());
      for (int n = 1; fs::exists(to); ++n) to = fs::path(directory_) / fmt::format("unmatched-{}.{}", from.filename().string(), n);
      fs::rename(from, to);
      fsync_directory(directory_);
      warn(fmt::format("not resuming from {}: the run resumes step {}, the newest that every part of it has "
                       "(moved to {})",
                       from.string(), *at_most, to.string()));
      continue;
    }
    try {
      if (is_foreign_dcp(path_of(*it))) verify_foreign_dcp(path_of(*it));  // PyTorch's dcp.save wrote it
      else verify_checkpoint(path_of(*it), *it);
      if (it != steps.rbegin()) {
        warn(fmt::format("falling back to the checkpoint {}", path_of(*it)));
      }
      return *it;
    } catch (const DataError& e) {
      warn(fmt::format("skipping the checkpoint {}: {}; {}", path_of(*it), e.what(),
                       set_aside(*it)));
    }
  }
  if (!steps.empty()) warn(fmt::format("no usable checkpoint in {}; starting afresh", directory_));
  return std::nullopt;
}

// A corrupt checkpoint keeps its bytes (someone may want to look at them) under a name
// that is no longer a step, so it neither shadows nor blocks newer saves.
std::string Checkpointer::set_aside(std::int64_t step) const {
  const fs::path from = path_of(step);
  const std::string name = kCorruptPrefix + from.filename().string();
  fs::path to = fs::path(directory_) / name;
  for (int n = 1; fs::exists(to); ++n) to = fs::path(directory_) / fmt::format("{}.{}", name, n);
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec) return fmt::format("could not move it aside ({}); it stays where it is", ec.message());
  fsync_directory(directory_);
  return fmt::format("moved aside to {}", to.string());
}

}  // namespace cohort::checkpoint
