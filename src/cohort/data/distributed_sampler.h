#pragma once
// Which samples this rank trains on: PyTorch's torch.utils.data.DistributedSampler
// for LibTorch's DataLoader, plus exact mid-epoch resume and re-sharding when the
// world size changes. Every rank shuffles the whole dataset the same way (seeded
// with seed + epoch) and takes every world_size-th sample of that order.
//
//   auto sampler = cohort::data::DistributedSampler(dataset.size().value(),
//       cohort::data::DistributedSamplerOptions(world.rank(), world.size()).seed(42));
//   auto loader = torch::data::make_data_loader(dataset, sampler,  // a copy: it shares
//       torch::data::DataLoaderOptions().batch_size(32));
//   for (std::int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);  // a new order each epoch, as in PyTorch
//     for (auto& batch : *loader) { ... ++samples_trained; }
//   }
//
// For a checkpoint, store sampler.state_after(samples_trained) (or state() when the
// loader has no workers: then the sampler hands out only what training consumed).
// To resume, load it with sampler.load_state(state) before the loop, and start the
// loop at state.epoch: set_epoch(state.epoch) and loader->begin() then continue at
// the next sample (Note [Resume through reset]), on any world size.
#include <torch/arg.h>
#include <torch/data/samplers/base.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace cohort::data {

struct DistributedSamplerOptions {
  // Rank and world size are passed explicitly (e.g. world.rank(), world.size()), so
  // that N samplers can live in one process, as in the tests.
  DistributedSamplerOptions(int rank, int world_size) : rank_(rank), world_size_(world_size) {}
  TORCH_ARG(int, rank);
  TORCH_ARG(int, world_size);
  // Shuffle every epoch, with the same permutation on every rank.
  TORCH_ARG(bool, shuffle) = true;
  // Epoch e uses a CPU generator seeded with seed + e; must be equal on every rank.
  TORCH_ARG(std::uint64_t, seed) = 0;
  // Drop the samples that do not divide evenly among ranks, instead of padding the
  // last round with repeats of the epoch's first samples.
  TORCH_ARG(bool, drop_last) = false;
};

// What a checkpoint stores: enough to continue an epoch at exactly the next sample,
// on any world size.
struct SamplerState {
  std::uint64_t seed = 0;
  bool shuffle = true;
  std::int64_t epoch = 0;
  std::int64_t dataset_size = 0;
  // How many entries of this epoch's global order all ranks together have taken.
  std::int64_t consumed = 0;
};

// Note [Sampler handles]
// torch::data::make_data_loader moves the sampler into the loader and gives no way
// back to it, so a plain sampler could never see set_epoch() or load_state(). A
// DistributedSampler is therefore a handle over shared state: the user keeps one
// copy and passes another to the loader, and both act on the same sampler. Copies
// (and moves, which copy, so that no handle is ever empty) share; clone() makes an
// independent sampler.
//
// Thread safety: none is needed for DataLoader. With workers > 0 the workers only
// fetch from the dataset; next() and reset() are called from the thread that
// iterates the loader. Do not use one sampler from several threads at once.
//
// Note [Resume through reset]
// DataLoader calls reset() at every begin(), and there is no other way for a resumed
// sampler to reach the loader's loop. So load_state() leaves its position *pending*:
// set_epoch() of the same epoch keeps it, and the next reset() starts from it instead
// of rewinding, then clears it. Any later reset() rewinds to the start of the epoch,
// as usual. A pending resume is also dropped by next() (the resume has started), by
// set_epoch() of another epoch, and by reset() with a new dataset size.
class DistributedSampler : public torch::data::samplers::Sampler<std::vector<std::size_t>> {
 public:
  // Throws cohort::ConfigError when rank or world_size are out of range.
  DistributedSampler(std::size_t dataset_size, const DistributedSamplerOptions& options);
  DistributedSampler(const DistributedSampler&) = default;
  DistributedSampler& operator=(const DistributedSampler&) = default;
  ~DistributedSampler() override = default;

  // An independent sampler in the same position (Note [Sampler handles]).
  DistributedSampler clone() const;

  // Starts epoch `epoch` at its first sample, unless load_state() left a resume of
  // that same epoch pending: then the resume position is kept.
  void set_epoch(std::int64_t epoch);

  // Called by DataLoader at every begin(): rewinds to the start of the epoch, or
  // starts a pending resume (Note [Resume through reset]). A new size different from
  // the dataset size changes it and drops a pending resume.
  void reset(torch::optional<std::size_t> new_size = torch::nullopt) override;

  // Up to batch_size of this rank's remaining indices; nullopt at the end of the epoch.
  torch::optional<std::vector<std::size_t>> next(std::size_t batch_size) override;

  // State after the samples handed out so far.
  SamplerState state() const;
  // State after this rank has consumed `local_samples` samples of the current plan,
  // counted from the loader's begin() (or the last set_epoch/reset/load_state). For
  // loaders whose workers fetch ahead of training, so that state() runs ahead.
  SamplerState state_after(std::size_t local_samples) const;
  // Continues state.epoch at state.consumed, re-sharded over this sampler's rank and
  // world size; the seed comes from the state. Throws cohort::ConfigError when the
  // state belongs to another dataset size or shuffle setting.
  void load_state(const SamplerState& state);

  // SamplerState under keys "distributed_sampler/..."; load() acts as load_state().
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // This rank's number of samples in the current plan (the whole epoch, or what is
  // left of it after a resume).
  std::size_t size() const;
  std::int64_t epoch() const;
  std::size_t dataset_size() const;
  const DistributedSamplerOptions& options() const;

 private:
  struct Impl;
  explicit DistributedSampler(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace cohort::data
