// Checkpointer::save: a whole checkpoint written by rank 0, or a sharded one that
// every rank writes its optimizer shard of (Note [Sharded checkpoints]).
#include "cohort/checkpoint/checkpointer.h"

#include <fmt/format.h>
#include <torch/serialize.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <sstream>

#include "cohort/checkpoint/async_save_internal.h"
#include "cohort/checkpoint/atomic_file.h"
#include "cohort/checkpoint/checkpointer_internal.h"
#include "cohort/checkpoint/gathered_state.h"
#include "cohort/checkpoint/manifest.h"
#include "cohort/checkpoint/rng_state.h"
#include "cohort/checkpoint/state_dict.h"
#include "cohort/checkpoint/torch_format.h"
#include "cohort/checkpoint/trainer_state.h"
#include "cohort/errors.h"

namespace fs = std::filesystem;

namespace cohort::checkpoint {
namespace {


// What rank 0's save came to; every rank learns it (max_over_ranks).
enum SaveOutcome : std::int64_t { kSaved = 0, kWriteFailed = 1, kRefused = 2, kEarlierWriteFailed = 3, kSkipped = 4 };

// Throws on every rank unless the save's outcome (the same on every rank) is kSaved.
void raise_unless_saved(std::int64_t outcome, int rank, const std::string& path, const std::string& error) {
  switch (outcome) {
    case kSaved:
      return;
    case kEarlierWriteFailed:
      throw Error(rank == 0 ? error
                            : "rank 0's asynchronous write of an earlier checkpoint failed; its log says why");
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

using Clock = std::chrono::steady_clock;

// The module's parameters and buffers by name, as state_dict() names them.
std::vector<std::pair<std::string, at::Tensor>> named_state(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value());
  for (const auto& item : model.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

}  // namespace

std::string optimizer_bytes(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

std::string Checkpointer::save(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                               const TrainingProgress& progress, c10::Device device) {
  const auto begin = Clock::now();
  if (async_ && !admit_asynchronous_save(progress.step, device)) return {};
  struct Blocked {  // how long this call held rank 0's training loop
    AsyncSave* async;
    Clock::time_point begin;
    ~Blocked() {
      if (async) async->blocked_for(std::chrono::duration<double>(Clock::now() - begin).count());
    }
  } blocked{async_.get(), begin};
  // Every rank's generators travel to rank 0, which writes them all.
  std::vector<std::vector<at::Tensor>> rng(static_cast<std::size_t>(group_.size()));
  for (const auto& state : capture_rng_state(device)) {
    const auto parts = group_.all_gather(state.to(device));
    for (std::size_t r = 0; r < parts.size(); ++r) rng[r].push_back(parts[r].cpu());
  }
  const std::string dcp_kind =
      options_.format() == Format::kDcp ? dcp_kind_of(optimizer, options_.dcp_optimizer()) : std::string();
  if (options_.split_parameters()) return save_split(model, optimizer, progress, device, rng, dcp_kind);
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
  return save_whole(
      progress, device,
      [&]() -> Deferred {
        if (async_) return model_copy(named_state(model), async_->copies());
        return [&] { return state_dict_bytes(model); };
      },
      [&]() -> Deferred {
        if (async_) return optimizer_copy(optimizer, async_->copies(), spread == nullptr, optimizer_bytes);
        return [&] { return optimizer_bytes(optimizer); };
      },
      rng, dcp_kind);
}

// Rank 0 says whether an asynchronous save goes ahead (Note [Asynchronous
// checkpoints]): not while the previous write runs under WhenBusy::kSkip; an
// earlier write that failed, or a step that would be refused, throws on every rank.
bool Checkpointer::admit_asynchronous_save(std::int64_t step, c10::Device device) {
  std::int64_t code = kSaved;
  std::string error;
  if (group_.rank() == 0) {
    if (options_.when_busy() == WhenBusy::kSkip && async_->busy()) {
      code = kSkipped;
    } else {
      async_->settle();
      if (auto failure = async_->take_failure()) {
        code = kEarlierWriteFailed;
        error = *failure;
      } else {
        error = refusal(step);
        if (!error.empty()) code = kRefused;
      }
    }
  }
  code = max_over_ranks(group_, code, device);
  if (code == kSkipped) {
    if (group_.rank() == 0) {
      async_->skipped();
      warn(fmt::format("skipped the checkpoint of step {}: the previous one is still being written "
                       "(CheckpointerOptions::when_busy is WhenBusy::kSkip)",
                       step));
    }
    return false;
  }
  raise_unless_saved(code, group_.rank(), path_of(step), error);
  return true;
}

// Rank 0 writes model.pt, optimizer.pt and trainer.pt into step-N.
std::string Checkpointer::save_whole(const TrainingProgress& progress, c10::Device device, const Part& model_part,
                                     const Part& optimizer_part, const std::vector<std::vector<at::Tensor>>& rng,
                                     const std::string& dcp_kind) {
  const std::string path = path_of(progress.step);
  const auto& files = whole_files(options_.format());
  // Note [Checkpoints in PyTorch's format]: made from the bytes of cohort's own files.
  auto contents = [format = options_.format(), step = progress.step, epoch = progress.epoch, dcp_kind, path](
                      std::string model, std::string optimizer, std::string trainer) -> std::vector<std::string> {
    if (format == Format::kDcp) return as_dcp_contents(model, optimizer, trainer, step, epoch, dcp_kind, path);
    return {std::move(model), std::move(optimizer), std::move(trainer)};
  };
  std::string error;
  SaveOutcome outcome = kSaved;
  if (group_.rank() == 0) {
    error = refusal(progress.step);
    if (!error.empty()) outcome = kRefused;
  }
  if (group_.rank() == 0 && outcome == kSaved && async_) {
    try {
      auto& copies = async_->copies();
      copies.begin();
      Deferred model = model_part();
      Deferred optimizer = optimizer_part();
      std::string trainer = encode_trainer_state(progress, rng);
      auto ready = copies.end();
      async_->start(
          path,
          [this, path, &files, contents, model = std::move(model), optimizer = std::move(optimizer),
           trainer = std::move(trainer)] {
            try {
              write(path, files, contents(model(), optimizer(), trainer));
            } catch (...) {
              std::error_code ignored;  // a full disk gets its space back
              fs::remove_all(temp_name(path, ::getpid()), ignored);
              throw;
            }
            prune_or_warn();
          },
          std::move(ready));
    } catch (const std::exception& e) {
      error = e.what();
      outcome = kWriteFailed;
    }
  } else if (group_.rank() == 0 && outcome == kSaved) {
    try {
      write(path, files, contents(model_part()(), optimizer_part()(), encode_trainer_state(progress, rng)));
    } catch (const std::exception& e) {
      error = e.what();
      outcome = kWriteFailed;
    }
    if (error.empty()) prune_or_warn();
  }
  raise_unless_saved(max_over_ranks(group_, outcome, device), group_.rank(), path, error);
  return path;
}

// A model split over TP groups, saved whole (Note [Checkpoints hold whole tensors]):
// the TP group of the writer (rank 0) gathers every split parameter and its
// optimizer state; the other TP groups, DP replicas of it, have nothing to do.
std::string Checkpointer::save_split(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                                     const TrainingProgress& progress, c10::Device device,
                                     const std::vector<std::vector<at::Tensor>>& rng, const std::string& dcp_kind) {
  if (options_.shard_optimizer_state() || dynamic_cast<const GathersStateForSave*>(&optimizer) != nullptr ||
      dynamic_cast<const SavesStateInShards*>(&optimizer) != nullptr)
    throw ConfigError("CheckpointerOptions::split_parameters (a tensor-parallel model) with a ZeRO optimizer "
                      "(cohort::zero::ShardedOptimizer or FullyShardedOptimizer, or shard_optimizer_state) is not "
                      "supported yet: its state is spread over the DP ranks and each rank's share is of TP "
                      "slices. Use a plain optimizer (its state is whole on every DP replica), or leave tensor "
                      "parallelism off");
  const auto& ours = group_.global_ranks();
  const int writer = ours[0];
  std::vector<ParameterSplit> splits;
  std::string error;
  for (auto& s : options_.split_parameters()(model)) {
    const auto& members = s.group.global_ranks();
    // The gathers run over TP groups: every member must be saving with us.
    for (int m : members)
      if (error.empty() && std::find(ours.begin(), ours.end(), m) == ours.end())
        error = fmt::format("CheckpointerOptions::split_parameters: '{}' is split over TP group '{}', whose global "
                            "rank {} is not in the checkpointer's group '{}'; give the Checkpointer a group made of "
                            "whole TP groups (the world's)",
                            s.name, s.group.name(), m, group_.name());
    if (std::find(members.begin(), members.end(), writer) != members.end()) splits.push_back(std::move(s));
  }
  // Ranks outside the writer's TP group skip the gathers, so a failure in them (an
  // optimizer of unknown state) must reach them before they wait for the writer.
  std::optional<c10::Dict<std::string, at::Tensor>> whole_model;
  std::optional<WholeOptimizerState> whole_optimizer;
  try {
    if (error.empty() && (group_.rank() == 0 || !splits.empty())) {
      whole_model = whole_state_dict(model, splits);
      whole_optimizer.emplace(optimizer, model, splits);
    }
  } catch (const ConfigError& e) {
    error = e.what();
  }
  if (any_rank(group_, !error.empty(), device))
    throw ConfigError(error.empty() ? fmt::format("rank 0's TP group could not gather the checkpoint of step {}; "
                                                  "its log says why",
                                                  progress.step)
                                    : error);
  return save_whole(
      progress, device,
      [&]() -> Deferred {
        if (!async_) return [&] { return torch_save_bytes(*whole_model); };
        std::vector<std::pair<std::string, at::Tensor>> named;
        for (const auto& item : *whole_model) named.emplace_back(item.key(), item.value());
        return model_copy(named, async_->copies());
      },
      [&]() -> Deferred {
        if (async_) return optimizer_copy(optimizer, async_->copies(), true, optimizer_bytes);
        return [&] { return optimizer_bytes(optimizer); };
      },
      rng, dcp_kind);
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

}  // namespace cohort::checkpoint
