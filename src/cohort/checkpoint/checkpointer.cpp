#include "cohort/checkpoint/checkpointer.h"

#include <fmt/format.h>
#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "cohort/checkpoint/atomic_file.h"
#include "cohort/checkpoint/gathered_state.h"
#include "cohort/checkpoint/manifest.h"
#include "cohort/checkpoint/rng_state.h"
#include "cohort/checkpoint/state_dict.h"
#include "cohort/checkpoint/trainer_state.h"
#include "cohort/errors.h"

namespace fs = std::filesystem;

namespace cohort::checkpoint {
namespace {

constexpr const char* kStepPrefix = "step-";
constexpr const char* kCorruptPrefix = "corrupt-";
const std::vector<std::string> kFiles = {"model.pt", "optimizer.pt", "trainer.pt"};  // a whole checkpoint

std::optional<std::int64_t> step_of(const std::string& name) {
  if (name.rfind(kStepPrefix, 0) != 0) return std::nullopt;
  const std::string digits = name.substr(std::string(kStepPrefix).size());
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) {
    return std::nullopt;  // not ours (18 digits always fit in an int64)
  }
  return std::stoll(digits);
}

// One code per rank, combined so that every rank learns the largest.
std::int64_t max_over_ranks(comm::Group& group, std::int64_t code, c10::Device device) {
  auto flag = torch::full({1}, code, torch::dtype(torch::kInt64).device(device));
  group.all_reduce(flag, comm::ReduceOp::kMax);
  return flag.item<std::int64_t>();
}

// One flag per rank, combined so that every rank learns whether any rank failed.
bool any_rank(comm::Group& group, bool failed, c10::Device device) {
  return max_over_ranks(group, failed ? 1 : 0, device) != 0;
}

// What rank 0's save came to; every rank learns it (max_over_ranks).
enum SaveOutcome : std::int64_t { kSaved = 0, kWriteFailed = 1, kRefused = 2 };

// Throws on every rank unless the save's outcome (the same on every rank) is kSaved.
void raise_unless_saved(std::int64_t outcome, int rank, const std::string& path, const std::string& error) {
  switch (outcome) {
    case kSaved:
      return;
    case kRefused:
      throw ConfigError(rank == 0 ? error
                                  : fmt::format("rank 0 refused to save the checkpoint {}: the directory "
                                                "holds newer checkpoints; its log says which",
                                                path));
    default:
      throw Error(rank == 0 ? fmt::format("could not write the checkpoint {}: {}", path, error)
                            : fmt::format("rank 0 could not write the checkpoint {}; its log says why", path));
  }
}

std::string optimizer_bytes(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load_optimizer(torch::optim::Optimizer& optimizer, const std::string& bytes,
                    const std::string& source, c10::Device device) {
  try {
    torch::serialize::InputArchive archive;
    std::istringstream in(bytes);
    archive.load_from(in, device);
    optimizer.load(archive);
  } catch (const c10::Error& e) {
    throw ConfigError(fmt::format("{}: the optimizer state does not fit this optimizer ({}); "
                                  "it was saved with another optimizer or model",
                                  source, e.what_without_backtrace()));
  } catch (const std::exception& e) {
    // LibTorch's archive reader throws std::runtime_error for some bad bytes, as its
    // unpickler does (see torch_load_bytes).
    throw DataError(fmt::format("{}: cannot be read as an optimizer state ({}); it is corrupt", source, e.what()));
  }
}

// A sharded checkpoint's optimizer state (Note [Resharding] in
// zero/sharded_optimizer.cpp): each rank reads the shards that hold its parameters.
void load_optimizer_shards(torch::optim::Optimizer& optimizer, const std::string& path, const Manifest& manifest) {
  auto* sharded = dynamic_cast<SavesStateInShards*>(&optimizer);
  if (sharded == nullptr)
    throw ConfigError(fmt::format("{} holds an optimizer state saved shard by shard (by a ShardedOptimizer over {} "
                                  "ranks) and this optimizer is a plain one; load it with a "
                                  "cohort::zero::ShardedOptimizer at any world size, or make one file of it with "
                                  "`cohort checkpoint consolidate {} OUT.pt`",
                                  path, manifest.shards->layout.world_size, path));
  sharded->load_shards(manifest.shards->layout, [&](int k) {
    return read_listed(path, manifest, manifest.shards->files.at(static_cast<std::size_t>(k)));
  });
}

}  // namespace

Checkpointer::Checkpointer(std::string directory, comm::Group group, CheckpointerOptions options)
    : directory_(std::move(directory)), group_(std::move(group)), options_(std::move(options)) {
  if (options_.keep_last() < 1) {
    throw ConfigError(fmt::format("CheckpointerOptions::keep_last is {}; it must be at least 1",
                                  options_.keep_last()));
  }
}

std::string Checkpointer::path_of(std::int64_t step) const {
  return fmt::format("{}/{}{:09d}", directory_, kStepPrefix, step);
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

std::string Checkpointer::save(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                               const TrainingProgress& progress, c10::Device device) {
  // Every rank's generators travel to rank 0, which writes them all.
  std::vector<std::vector<at::Tensor>> rng(static_cast<std::size_t>(group_.size()));
  for (const auto& state : capture_rng_state(device)) {
    const auto parts = group_.all_gather(state.to(device));
    for (std::size_t r = 0; r < parts.size(); ++r) rng[r].push_back(parts[r].cpu());
  }
  if (options_.shard_optimizer_state()) {
    // The same answer on every rank: each has the same kind of optimizer.
    const auto* sharded = dynamic_cast<const SavesStateInShards*>(&optimizer);
    if (sharded == nullptr)
      throw ConfigError("CheckpointerOptions::shard_optimizer_state is for an optimizer spread over the ranks "
                        "(cohort::zero::ShardedOptimizer); this one is whole on every rank. Leave the option off");
    return save_sharded(model, *sharded, progress, device, rng);
  }
  // An optimizer spread over the ranks (ZeRO) gathers its state to rank 0 first.
  const auto* spread = dynamic_cast<const GathersStateForSave*>(&optimizer);
  if (spread) spread->gather_state_for_save(group_.global_ranks()[0]);
  struct Release {
    const GathersStateForSave* spread;
    ~Release() {
      if (spread) spread->release_gathered_state();
    }
  } release{spread};
  const std::string path = path_of(progress.step);
  std::string error;
  SaveOutcome outcome = kSaved;
  if (group_.rank() == 0) {
    error = refusal(progress.step);
    if (!error.empty()) outcome = kRefused;
  }
  if (group_.rank() == 0 && outcome == kSaved) {
    try {
      const std::vector<std::string> contents = {
          state_dict_bytes(model), optimizer_bytes(optimizer),
          encode_trainer_state(progress, rng)};
      write(path, kFiles, contents);
    } catch (const std::exception& e) {
      error = e.what();
      outcome = kWriteFailed;
    }
    if (error.empty()) prune_or_warn();
  }
  raise_unless_saved(max_over_ranks(group_, outcome, device), group_.rank(), path, error);
  return path;
}

// Note [Sharded checkpoints]
// Every rank writes its own optimizer shard, so no rank ever holds the whole state,
// and the checkpoint stays as atomic as a whole one (Note [Checkpoint directories]):
//   1. rank 0 checks the step (Note [Never older than the newest]) and makes the
//      temporary directory; its process id, broadcast, names it for every rank;
//   2. each rank writes optimizer-shard-<rank>-of-<n>.pt into it, fsync'ed, and all
//      gather each one's success, size and CRC-32 (rank 0 never reads the shards);
//   3. rank 0 writes the model, the trainer state and the manifest (with the shard
//      layout) and renames the directory into place, as a whole save does.
// A kill at any moment leaves a temporary directory, which no load reads and the
// next save removes; never a step-N with a missing or foreign shard. A shard that
// goes missing or bad later fails its manifest check, and load_latest falls back
// to the previous checkpoint, naming the file.
std::string Checkpointer::save_sharded(const torch::nn::Module& model, const SavesStateInShards& optimizer,
                                       const TrainingProgress& progress, c10::Device device,
                                       const std::vector<std::vector<at::Tensor>>& rng) {
  const auto layout = optimizer.shard_layout();
  if (layout.world_size != group_.size())
    throw ConfigError(fmt::format("CheckpointerOptions::shard_optimizer_state: the optimizer is spread over {} "
                                  "ranks and the checkpointer's group has {}; give both the same group",
                                  layout.world_size, group_.size()));
  const std::string path = path_of(progress.step);
  std::string error;
  auto head = torch::zeros({2}, torch::dtype(torch::kInt64));
  if (group_.rank() == 0) {
    error = refusal(progress.step);
    head[0] = static_cast<std::int64_t>(error.empty() ? kSaved : kRefused);
    head[1] = static_cast<std::int64_t>(::getpid());
    if (error.empty()) {
      try {
        make_temp_directory(path);
      } catch (const std::exception& e) {
        error = e.what();
        head[0] = static_cast<std::int64_t>(kWriteFailed);
      }
    }
  }
  head = head.to(device);
  group_.broadcast(head, 0);
  head = head.cpu();
  raise_unless_saved(head[0].item<std::int64_t>(), group_.rank(), path, error);
  const std::string temp = temp_name(path, static_cast<long>(head[1].item<std::int64_t>()));

  // 2. This rank's shard.
  const std::string name = shard_file_name(group_.rank(), group_.size());
  std::int64_t written = 1, size = 0, crc = 0;
  {
    const std::string bytes = optimizer.shard_bytes();
    size = static_cast<std::int64_t>(bytes.size());
    crc = static_cast<std::int64_t>(crc32_of(bytes));
    try {
      write_file_durably(temp + "/" + name, bytes);
    } catch (const std::exception& e) {
      error = e.what();
      written = 0;
    }
  }
  const auto rows = group_.all_gather(torch::tensor({written, size, crc}, torch::kInt64).to(device));
  Manifest manifest;
  manifest.step = progress.step;
  manifest.shards = ShardedOptimizerFiles{layout, {}};
  std::vector<int> failed;
  for (int r = 0; r < group_.size(); ++r) {
    const auto row = rows[static_cast<std::size_t>(r)].cpu();
    const auto file = shard_file_name(r, group_.size());
    manifest.shards->files.push_back(file);
    manifest.files[file] = {static_cast<std::uint64_t>(row[1].item<std::int64_t>()),
                            static_cast<std::uint32_t>(row[2].item<std::int64_t>())};
    if (row[0].item<std::int64_t>() == 0) failed.push_back(r);
  }
  if (!failed.empty()) {
    if (group_.rank() == 0) {
      std::error_code ignored;
      fs::remove_all(temp, ignored);
    }
    throw Error(written == 0 ? fmt::format("rank {} could not write its optimizer shard of the checkpoint {}: {}",
                                           group_.rank(), path, error)
                             : fmt::format("rank {} could not write its optimizer shard of the checkpoint {}; its "
                                           "log says why (every rank writes into the checkpoint directory, so it "
                                           "must be on a file system that every node shares)",
                                           failed[0], path));
  }

  // 3. Rank 0 completes the directory and renames it into place.
  SaveOutcome outcome = kSaved;
  if (group_.rank() == 0) {
    try {
      const std::vector<std::pair<std::string, std::string>> files = {
          {"model.pt", state_dict_bytes(model)}, {"trainer.pt", encode_trainer_state(progress, rng)}};
      for (const auto& [file, bytes] : files) {
        write_file_durably(temp + "/" + file, bytes);
        manifest.files[file] = {bytes.size(), crc32_of(bytes)};
      }
      write_file_durably(temp + "/" + kManifestName, manifest_json(manifest));
      fsync_directory(temp);
      install(temp, path);
    } catch (const std::exception& e) {
      error = e.what();
      outcome = kWriteFailed;
      std::error_code ignored;
      fs::remove_all(temp, ignored);
    }
    if (outcome == kSaved) prune_or_warn();
  }
  raise_unless_saved(max_over_ranks(group_, outcome, device), group_.rank(), path, error);
  return path;
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
      verify_checkpoint(path_of(*it), *it);
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

std::optional<Restored> Checkpointer::load_latest(torch::nn::Module& model,
                                                  torch::optim::Optimizer& optimizer,
                                                  c10::Device device,
                                                  std::optional<std::int64_t> at_most) {
  // Rank 0 chooses, so that every rank loads the same checkpoint even if one is
  // being damaged while they look.
  auto chosen = torch::full({1}, std::int64_t{-1}, torch::dtype(torch::kInt64).device(device));
  std::string choice_error;
  if (group_.rank() == 0) {
    try {
      chosen.fill_(newest_good_step(at_most).value_or(-1));
    } catch (const std::exception& e) {
      choice_error = e.what();
      chosen.fill_(-2);  // tells the others to fail too, instead of waiting
    }
  }
  group_.broadcast(chosen, 0);
  const std::int64_t step = chosen.item<std::int64_t>();
  if (step == -2) {
    throw Error(group_.rank() == 0 ? choice_error
                                   : fmt::format("rank 0 could not look for checkpoints in {}; its log says why",
                                                 directory_));
  }
  if (step < 0) return std::nullopt;

  const std::string path = path_of(step);
  Manifest manifest;
  std::string model_bytes, optimizer_file;
  TrainerState trainer;
  std::string error;
  try {
    manifest = read_manifest(path, step);
    model_bytes = read_listed(path, manifest, "model.pt");
    trainer = decode_trainer_state(read_listed(path, manifest, "trainer.pt"), path + "/trainer.pt");
    if (!manifest.shards) optimizer_file = read_listed(path, manifest, "optimizer.pt");
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (any_rank(group_, !error.empty(), device)) {
    throw DataError(error.empty()
                        ? fmt::format("another rank could not read the checkpoint {}; its log "
                                      "says why",
                                      path)
                        : fmt::format("rank {} could not read the checkpoint {}: {}; every rank "
                                      "reads what rank 0 wrote, so the directory must be on a "
                                      "file system that every node shares",
                                      group_.rank(), path, error));
  }
  // Note [Nothing changes until everything fits]: the model is checked, then the
  // optimizer loads (it changes nothing when it refuses), and only then does the
  // model take the saved weights. A refused checkpoint leaves both as they were.
  const auto checked_model = check_state_dict(model, model_bytes, path + "/model.pt");
  if (manifest.shards) {
    // Ranks read different shards, so one may fail alone: all answer together.
    std::int64_t code = 0;  // 1: unreadable (DataError), 2: does not fit (ConfigError)
    try {
      load_optimizer_shards(optimizer, path, manifest);
    } catch (const ConfigError& e) {
      error = e.what();
      code = 2;
    } catch (const std::exception& e) {
      error = e.what();
      code = 1;
    }
    code = max_over_ranks(group_, code, device);
    if (code != 0) {
      const std::string message =
          error.empty() ? fmt::format("another rank could not load its share of the optimizer state of {}; its log "
                                      "says why",
                                      path)
                        : fmt::format("rank {}: {}", group_.rank(), error);
      if (code == 2) throw ConfigError(message);
      throw DataError(message);
    }
  } else {
    load_optimizer(optimizer, optimizer_file, path + "/optimizer.pt", device);
  }
  checked_model.apply();

  Restored restored{trainer.progress, path, false};
  const std::size_t generators = capture_rng_state(device).size();
  if (static_cast<int>(trainer.rng.size()) != group_.size()) {
    if (group_.rank() == 0) {
      warn(fmt::format("{} was saved by {} ranks and is loaded by {}: the random generators keep "
                       "their fresh state",
                       path, trainer.rng.size(), group_.size()));
    }
  } else if (trainer.rng[static_cast<std::size_t>(group_.rank())].size() != generators) {
    if (group_.rank() == 0) {
      warn(fmt::format("{} was saved on another kind of device ({} generator states per rank, {} here): "
                       "the random generators keep their fresh state",
                       path, trainer.rng[0].size(), generators));
    }
  } else {
    restore_rng_state(device, trainer.rng[static_cast<std::size_t>(group_.rank())]);
    restored.rng_restored = true;
  }
  return restored;
}

}  // namespace cohort::checkpoint
