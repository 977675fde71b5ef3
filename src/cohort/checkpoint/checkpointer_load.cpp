// Checkpointer::load_latest: the newest good checkpoint into the model, the
// optimizer (whole or resharded) and this rank's generators.
#include "cohort/checkpoint/checkpointer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>

#include <sstream>

#include "cohort/checkpoint/checkpointer_internal.h"
#include "cohort/checkpoint/gathered_state.h"
#include "cohort/checkpoint/manifest.h"
#include "cohort/checkpoint/rng_state.h"
#include "cohort/checkpoint/state_dict.h"
#include "cohort/checkpoint/torch_format.h"
#include "cohort/checkpoint/trainer_state.h"
#include "cohort/errors.h"

namespace cohort::checkpoint {
namespace {

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

// Note [Checkpoints hold whole tensors] (split_state.cpp): this rank's chunk of
// each split parameter.
CheckedStateDict check_split_state_dict(torch::nn::Module& model, const std::string& bytes, const std::string& source,
                                        const std::vector<ParameterSplit>& splits) {
  auto value = torch_load_bytes(bytes, source);
  if (value.isGenericDict()) value = slice_state_dict(value.toGenericDict(), model, splits, source);
  return check_state_dict(model, value, source);
}

// The whole optimizer state, then this rank's chunk of each split parameter's; on a
// refusal the optimizer takes back what it held (Note [Nothing changes until
// everything fits]).
void load_split_optimizer(torch::optim::Optimizer& optimizer, const torch::nn::Module& model, const std::string& bytes,
                          const std::string& source, c10::Device device, const std::vector<ParameterSplit>& splits) {
  const std::string before = optimizer_bytes(optimizer);
  load_optimizer(optimizer, bytes, source, device);
  try {
    slice_optimizer_state(optimizer, model, splits, source);
  } catch (...) {
    optimizer.state().clear();  // loading adds states, it never removes one
    load_optimizer(optimizer, before, "the optimizer's own state", device);
    throw;
  }
}

}  // namespace

std::optional<Restored> Checkpointer::load_latest(torch::nn::Module& model,
                                                  torch::optim::Optimizer& optimizer,
                                                  c10::Device device,
                                                  std::optional<std::int64_t> at_most) {
  settle_writes();  // a write in flight is finished first (its failure stays to be reported)
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
  bool in_dcp = false;  // Note [Checkpoints in PyTorch's format]
  std::vector<std::string> ignored;
  try {
    const bool foreign = is_foreign_dcp(path);
    if (!foreign) manifest = read_manifest(path, step);
    in_dcp = foreign || manifest.files.count(".metadata") != 0;
    if (in_dcp) {
      auto dcp = read_dcp_checkpoint(path, foreign ? nullptr : &manifest, step);
      model_bytes = std::move(dcp.model);
      optimizer_file = std::move(dcp.optimizer);
      trainer = std::move(dcp.trainer);
      ignored = std::move(dcp.ignored);
    } else {
      model_bytes = read_listed(path, manifest, "model.pt");
      trainer = decode_trainer_state(read_listed(path, manifest, "trainer.pt"), path + "/trainer.pt");
      if (!manifest.shards) optimizer_file = read_listed(path, manifest, "optimizer.pt");
    }
  } catch (const ConfigError& e) {
    error = e.what();  // the same on every rank (each reads the same files)
    if (in_dcp) {
      any_rank(group_, true, device);
      throw;
    }
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
  std::vector<ParameterSplit> splits;
  if (options_.split_parameters()) {
    if (manifest.shards || dynamic_cast<SavesStateInShards*>(&optimizer) != nullptr ||
        dynamic_cast<GathersStateForSave*>(&optimizer) != nullptr)
      throw ConfigError(fmt::format("{}: CheckpointerOptions::split_parameters (a tensor-parallel model) with a ZeRO "
                                    "optimizer or a checkpoint of one is not supported yet; load it with a plain "
                                    "optimizer, or without tensor parallelism",
                                    path));
    splits = options_.split_parameters()(model);
  }
  if (group_.rank() == 0 && !ignored.empty())
    warn(fmt::format("{}: not loaded, as cohort has no use for them: {}", path, fmt::join(ignored, ", ")));
  const bool no_optimizer = in_dcp && optimizer_file.empty();
  if (no_optimizer && group_.rank() == 0)
    warn(fmt::format("{} holds no optimizer state: the optimizer keeps its own", path));
  const auto checked_model = splits.empty() ? check_state_dict(model, model_bytes, path + "/model.pt")
                                            : check_split_state_dict(model, model_bytes, path + "/model.pt", splits);
  if (no_optimizer) {
    // the model alone (a checkpoint for fine-tuning)
  } else if (!splits.empty()) {
    load_split_optimizer(optimizer, model, optimizer_file, path + "/optimizer.pt", device, splits);
  } else if (manifest.shards) {
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
  if (trainer.rng.empty()) {
    if (group_.rank() == 0)
      warn(fmt::format("{} was written by PyTorch and holds no random generator states: they keep their fresh "
                       "state",
                       path));
  } else if (static_cast<int>(trainer.rng.size()) != group_.size()) {
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
