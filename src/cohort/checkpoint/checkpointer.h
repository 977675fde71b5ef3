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
// With format(Format::kDcp), .metadata and __0_0.distcp replace model.pt and
// optimizer.pt: PyTorch's dcp.load reads the directory. load_latest reads both kinds,
// and a `step-<step>` directory that PyTorch's dcp.save wrote (torchtitan's layout),
// resharded to this run's world size and layout (dcp/reader.h).
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
//
// With asynchronous(true), save() pays only for a copy of the state into host memory
// and returns; a writer thread serialises, checksums, fsyncs and installs the
// directory as above (Note [Asynchronous checkpoints] in async_save_internal.h).
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/checkpoint/sharded_state.h"
#include "cohort/checkpoint/split_state.h"
#include "cohort/comm/group.h"
#include "cohort/data/distributed_sampler.h"

namespace cohort::checkpoint {

class AsyncSave;  // the writer thread of asynchronous saves (async_save_internal.h)

// What an asynchronous save() does while the previous checkpoint is still being
// written (at most one is in flight).
enum class WhenBusy {
  kWait,  // wait for it, then copy and start this one: no checkpoint is lost
  kSkip,  // skip this one with a warning (on rank 0); training never waits for the disk
};

// What an asynchronous checkpointer has done, on rank 0 (the writer); zeros elsewhere.
struct AsyncStats {
  std::int64_t started = 0;     // saves handed to the writer thread
  std::int64_t written = 0;     // of those, installed as step-N
  std::int64_t failed = 0;      // of those, not written (reported at the next save or wait)
  std::int64_t skipped = 0;     // saves skipped under WhenBusy::kSkip
  std::int64_t host_bytes = 0;  // host memory held for the copies, reused between saves
  std::int64_t host_allocations = 0;  // host buffers allocated so far, all saves together
  double last_blocked_s = 0;    // how long the last save() held the caller, on rank 0
  double last_write_s = 0;      // how long the writer took for the last finished write
  // CPU time the writer thread used, all writes together: what the checkpoints took
  // from training besides the blocked time, where training has no core to spare.
  double writer_cpu_s = 0;
};

// What a checkpoint directory holds (Note [Checkpoints in PyTorch's format] in
// checkpointer_dcp.cpp). Loading reads either, and PyTorch's own: no option needed.
enum class Format {
  kCohort,  // model.pt (torch.load reads it), optimizer.pt (LibTorch's), trainer.pt
  kDcp,     // PyTorch's distributed checkpoint (.metadata, __0_0.distcp), which
            // torch.distributed.checkpoint.load reads at any world size, and trainer.pt
};

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
  // save() copies the state into host memory (pinned for CUDA tensors, into buffers
  // reused from one save to the next) and returns; a writer thread on rank 0 writes
  // the checkpoint. A failed write is reported on every rank by the next save() or
  // wait(); call wait() before the end of training (Note [Asynchronous checkpoints]).
  // Not with shard_optimizer_state (refused with a ConfigError).
  TORCH_ARG(bool, asynchronous) = false;
  // With asynchronous(true): what a save() does while the previous one is in flight.
  TORCH_ARG(WhenBusy, when_busy) = WhenBusy::kWait;
  // Format::kDcp: the step-N directory is also a PyTorch distributed checkpoint of
  // {"model", "optim", "train": {"step", "epoch"}} as get_state_dict names them
  // (docs/checkpoints.md#pytorchs-distributed-checkpoints), checked by the manifest as
  // ever. Not with shard_optimizer_state (refused with a ConfigError).
  TORCH_ARG(Format, format) = Format::kCohort;
  // With Format::kDcp: which PyTorch optimizer the state is written for (adam, adamw,
  // sgd). Empty: from the optimizer's C++ type; an optimizer that does not say (a
  // ZeRO one) is written as adam, or sgd, from its options.
  TORCH_ARG(std::string, dcp_optimizer) = "";
  // For tests: called by the writer thread with the temporary directory once its
  // files are written, before the manifest; what it throws fails that write.
  TORCH_ARG(std::function<void(const std::string&)>, before_manifest) = nullptr;
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
  // Waits for a write in flight (a failure not yet reported is warned about).
  ~Checkpointer();
  Checkpointer(Checkpointer&&) noexcept;
  Checkpointer& operator=(Checkpointer&&) = delete;

  // Collective. Rank 0 writes the checkpoint of `progress.step` and removes the ones
  // beyond keep_last; every rank returns the directory's path, or every rank throws if
  // rank 0 could not write it. A step older than the newest checkpoint on disk is
  // refused on every rank with a cohort::ConfigError, and nothing on disk changes
  // (Note [Never older than the newest]); saving the newest step again replaces it.
  // Asynchronous: returns once the state is copied, with the path the writer will
  // install; an empty string when WhenBusy::kSkip skipped it. It first throws on
  // every rank if the previous asynchronous write failed.
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

  // Collective. Returns once no write is in flight; throws on every rank if the last
  // asynchronous write failed. Nothing to do for a synchronous checkpointer.
  void wait(c10::Device device);
  // Not collective: on rank 0, the error of an asynchronous write that failed and
  // has not been reported yet, for a log line at the next step; the next save() or
  // wait() raises it.
  std::optional<std::string> write_failure() const;
  AsyncStats async_stats() const;

  // Steps of the complete checkpoints on disk, oldest first (checksums not checked).
  std::vector<std::int64_t> steps_on_disk() const;
  std::string path_of(std::int64_t step) const;
  const std::string& directory() const { return directory_; }

 private:
  void warn(const std::string& message) const;
  std::optional<std::int64_t> newest_good_step(std::optional<std::int64_t> at_most) const;
  void write(const std::string& final_path, const std::vector<std::string>& files,
             const std::vector<std::string>& contents) const;
  // model_part and optimizer_part return what makes the file's bytes: at once when
  // saving synchronously, on the writer thread from host copies otherwise.
  // `dcp_kind`: with Format::kDcp, the PyTorch optimizer it is written for.
  using Part = std::function<std::function<std::string()>()>;
  std::string save_whole(const TrainingProgress& progress, c10::Device device, const Part& model_part,
                         const Part& optimizer_part, const std::vector<std::vector<at::Tensor>>& rng,
                         const std::string& dcp_kind);
  std::string save_split(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                         const TrainingProgress& progress, c10::Device device,
                         const std::vector<std::vector<at::Tensor>>& rng, const std::string& dcp_kind);
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

  bool admit_asynchronous_save(std::int64_t step, c10::Device device);
  void settle_writes() const;  // rank 0: waits for a write in flight, keeping its outcome

  std::string directory_;
  comm::Group group_;
  CheckpointerOptions options_;
  std::unique_ptr<AsyncSave> async_;  // with asynchronous(true), on rank 0
};

}  // namespace cohort::checkpoint
