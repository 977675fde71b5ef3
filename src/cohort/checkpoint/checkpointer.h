#pragma once
// Checkpoints of a training run: model, optimizer, sampler position, step, epoch and
// every rank's random generators, so that a resumed run continues exactly where the
// checkpoint was taken.
//
//   cohort::checkpoint::Checkpointer ckpt(dir, world.group(),
//       cohort::checkpoint::CheckpointerOptions().keep_last(3));
//   if (auto restored = ckpt.load_latest(*model, optimizer, world.device())) {
//     step = restored->progress.step;  sampler.load_state(*restored->progress.sampler);
//   }
//   ...
//   ckpt.save(*model, optimizer, {step, epoch, epoch_step, sampler.state()}, world.device());
//
// Both calls are collective: every rank of the group calls them. Rank 0 writes; every
// rank reads, so with several nodes the directory must be on a shared file system.
//
// On disk, each checkpoint is a directory `step-<step>` holding
//   model.pt       the state dict, readable by Python's torch.load (state_dict.h);
//   optimizer.pt   LibTorch's serialized optimizer state;
//   trainer.pt     step, epoch, sampler state and each rank's generator states;
//   MANIFEST.json  the size and CRC-32 of each file, written last.
// With shard_optimizer_state(true) and an optimizer that is spread over the ranks
// (zero::ShardedOptimizer), optimizer.pt is replaced by one file per rank,
//   optimizer-shard-<k>-of-<n>.pt   the state of the parameters rank k owns,
// written by that rank, and the manifest records who owned what; a later run at
// any world size reshards it on load (Note [Sharded checkpoints]). Every rank
// then writes into the directory too. `cohort checkpoint consolidate` turns such a
// checkpoint into one file that Python reads (checkpoint/consolidate.h).
// With split_parameters (tensor parallelism), model.pt and optimizer.pt hold every
// parameter whole, as one process would (checkpoint/split_state.h).
// Note [Checkpoint directories]: the directory is written under a temporary name, each
// file and the directory are fsync'ed, and it is renamed into place (Note [Atomic
// replace]), so a `step-*` directory is always complete. The manifest's checksums
// catch what atomicity cannot: a file damaged later (a bad disk, a truncating copy).
// Loading checks them and falls back to the next older checkpoint, with a warning.
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cohort/checkpoint/sharded_state.h"
#include "cohort/checkpoint/split_state.h"
#include "cohort/comm/group.h"
#include "cohort/data/distributed_sampler.h"

namespace cohort::checkpoint {

struct CheckpointerOptions {
  // How many checkpoints to keep; older ones are removed after each save.
  TORCH_ARG(int, keep_last) = 3;
  // Where warnings go (a skipped corrupt checkpoint, generators not restored).
  // Defaults to standard error.
  TORCH_ARG(std::function<void(const std::string&)>, warn) = nullptr;
  // Save an optimizer that implements SavesStateInShards (zero::ShardedOptimizer)
  // shard by shard, each rank its own, instead of gathering it to rank 0. Its group
  // must be the checkpointer's. Any other optimizer is refused with a ConfigError.
  // Loading needs no option: the manifest says how a checkpoint was saved.
  TORCH_ARG(bool, shard_optimizer_state) = false;
  // For a model split over TP groups: finds its split parameters
  // (cohort::tensor_parallel::parameter_splits). Saving gathers them, and their
  // optimizer state, whole; loading keeps this rank's chunk, so a checkpoint loads
  // at any TP and DP size (Note [Checkpoints hold whole tensors]). Give it when
  // loading too. Not with a ZeRO optimizer (refused with a ConfigError).
  TORCH_ARG(SplitsOf, split_parameters) = nullptr;
};

struct TrainingProgress {
  std::int64_t step = 0;   // optimizer steps taken
  std::int64_t epoch = 0;  // the epoch in progress
  std::int64_t epoch_step = 0;  // optimizer steps taken in that epoch
  std::optional<data::SamplerState> sampler;
  // Other state that must resume with the run, by name: a GradScaler's state_dict
  // under "grad_scaler" (amp/grad_scaler.h). Saved as rank 0 has it.
  std::map<std::string, c10::IValue> extra;
};

struct Restored {
  TrainingProgress progress;
  std::string path;           // the checkpoint directory that was loaded
  bool rng_restored = false;  // false when the world size changed since the save
};

class Checkpointer {
 public:
  Checkpointer(std::string directory, comm::Group group, CheckpointerOptions options = {});

  // Collective. Rank 0 writes the checkpoint of `progress.step` and removes the ones
  // beyond keep_last; every rank returns the directory's path, or every rank throws if
  // rank 0 could not write it. A step older than the newest checkpoint on disk is
  // refused on every rank with a cohort::ConfigError, and nothing on disk changes
  // (Note [Never older than the newest]); saving the newest step again replaces it.
  std::string save(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                   const TrainingProgress& progress, c10::Device device);

  // Collective. Loads the newest checkpoint whose checksums hold into `model`,
  // `optimizer` and this rank's generators; std::nullopt when there is none. Corrupt
  // newer ones are skipped with a warning and renamed corrupt-step-N (kept, no
  // longer a step). A checkpoint from another model is a
  // cohort::ConfigError (no fallback: an older one would not fit either).
  //
  // With `at_most`, steps newer than it are not loaded: they are moved aside to
  // unmatched-step-N (kept, no longer a step, so later saves are not refused). Used
  // when several checkpointers must resume the same step, as pipeline stages do
  // (pipeline/checkpoint.h).
  std::optional<Restored> load_latest(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                                      c10::Device device, std::optional<std::int64_t> at_most = std::nullopt);

  // Steps of the complete checkpoints on disk, oldest first (checksums not checked).
  std::vector<std::int64_t> steps_on_disk() const;
  std::string path_of(std::int64_t step) const;
  const std::string& directory() const { return directory_; }

 private:
  void warn(const std::string& message) const;
  std::optional<std::int64_t> newest_good_step(std::optional<std::int64_t> at_most) const;
  void write(const std::string& final_path, const std::vector<std::string>& files,
             const std::vector<std::string>& contents) const;
  std::string save_whole(const TrainingProgress& progress, c10::Device device,
                         const std::function<std::string()>& model_bytes,
                         const std::function<std::string()>& optimizer_state_bytes,
                         const std::vector<std::vector<at::Tensor>>& rng);
  std::string save_split(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                         const TrainingProgress& progress, c10::Device device,
                         const std::vector<std::vector<at::Tensor>>& rng);
  std::string save_sharded(const torch::nn::Module& model, const SavesStateInShards& optimizer,
                           const TrainingProgress& progress, c10::Device device,
                           const std::vector<std::vector<at::Tensor>>& rng);
  std::string temp_name(const std::string& final_path, long id) const;
  std::string make_temp_directory(const std::string& final_path) const;
  void install(const std::string& temp, const std::string& final_path) const;
  void prune() const;
  void prune_or_warn() const;
  std::string refusal(std::int64_t step) const;
  std::string set_aside(std::int64_t step) const;

  std::string directory_;
  comm::Group group_;
  CheckpointerOptions options_;
};

}  // namespace cohort::checkpoint
