#include "cohort/data/distributed_sampler.h"

#include "cohort/errors.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <string>
#include <utility>

namespace cohort::data {

// Note [Plans and offsets]
// A plan is this rank's share of one epoch from a global offset o: the rest of the
// epoch's order (the same on every rank), order[o, N), cut (drop_last) or padded to a
// multiple of W, and dealt out round-robin: rank r gets entries r, r+W, r+2W, ... So
// after every rank took k samples, together they took exactly order[o, o + k*W), and
// "consumed" = o + k*W describes the position without naming a world size. A resume
// on another world size deals order[consumed, N) afresh, which loses and doubles
// nothing beyond the drop/pad of the new remainder.
// Padding continues the order cyclically past its end: entry i of the plan is
// order[(o + i) mod N]. At o = 0 that is PyTorch's padding (the epoch's beginning,
// repeated if need be), and a resume on the same world size hands out exactly what
// the uninterrupted run would have, padding included.
struct DistributedSampler::Impl {
  DistributedSamplerOptions options;
  std::size_t dataset_size = 0;
  std::int64_t epoch = 0;
  std::size_t offset = 0;          // where the plan starts in the epoch's order
  std::vector<std::size_t> shard;  // this rank's entries of the plan
  std::size_t cursor = 0;          // how many of them next() handed out
  bool resume_pending = false;     // Note [Resume through reset]

  Impl(std::size_t size, DistributedSamplerOptions opts) : options(opts), dataset_size(size) {}

  std::vector<std::size_t> epoch_order() const {
    std::vector<std::size_t> order(dataset_size);
    if (!options.shuffle()) {
      for (std::size_t i = 0; i < dataset_size; ++i) order[i] = i;
      return order;
    }
    // As PyTorch: g.manual_seed(seed + epoch); randperm(n, generator=g). Python maps a
    // negative seed to seed mod 2^64, which is what unsigned wrap-around gives.
    auto generator =
        at::make_generator<at::CPUGeneratorImpl>(options.seed() + static_cast<std::uint64_t>(epoch));
    const auto perm = torch::randperm(static_cast<std::int64_t>(dataset_size), generator,
                                      torch::TensorOptions().dtype(torch::kLong));
    const auto* data = perm.data_ptr<std::int64_t>();
    for (std::size_t i = 0; i < dataset_size; ++i) order[i] = static_cast<std::size_t>(data[i]);
    return order;
  }

  // Note [Plans and offsets].
  void plan(std::int64_t new_epoch, std::size_t new_offset) {
    TORCH_INTERNAL_ASSERT(new_offset <= dataset_size);
    epoch = new_epoch;
    offset = new_offset;
    cursor = 0;
    shard.clear();
    const auto world = static_cast<std::size_t>(options.world_size());
    const auto rank = static_cast<std::size_t>(options.rank());
    const std::size_t rest = dataset_size - offset;
    const std::size_t rounds = options.drop_last() ? rest / world : (rest + world - 1) / world;
    if (rounds == 0) return;
    const auto order = epoch_order();
    shard.reserve(rounds);
    // rest > 0 here, so dataset_size > 0.
    for (std::size_t i = rank; i < rounds * world; i += world) {
      shard.push_back(order[(offset + i) % dataset_size]);
    }
  }

  SamplerState state_at(std::size_t local_samples) const {
    const auto world = static_cast<std::size_t>(options.world_size());
    SamplerState s;
    s.seed = options.seed();
    s.shuffle = options.shuffle();
    s.epoch = epoch;
    s.dataset_size = static_cast<std::int64_t>(dataset_size);
    // The last round may hold padding: past the end of the order means all of it.
    s.consumed = static_cast<std::int64_t>(std::min(offset + local_samples * world, dataset_size));
    return s;
  }
};

namespace {

const char* bool_text(bool b) { return b ? "true" : "false"; }

constexpr const char* kKeys[] = {"distributed_sampler/seed", "distributed_sampler/shuffle",
                                 "distributed_sampler/epoch", "distributed_sampler/dataset_size",
                                 "distributed_sampler/consumed"};

}  // namespace

DistributedSampler::DistributedSampler(std::size_t dataset_size, const DistributedSamplerOptions& options)
    : impl_(std::make_shared<Impl>(dataset_size, options)) {
  if (options.world_size() < 1) {
    throw ConfigError(fmt::format(
        "cohort: DistributedSampler: world_size must be >= 1, got {}; pass the world's size "
        "(DistributedSamplerOptions(world.rank(), world.size()))",
        options.world_size()));
  }
  if (options.rank() < 0 || options.rank() >= options.world_size()) {
    throw ConfigError(fmt::format(
        "cohort: DistributedSampler: rank must be in [0, world_size) = [0, {}), got {}; pass this "
        "process's rank (DistributedSamplerOptions(world.rank(), world.size()))",
        options.world_size(), options.rank()));
  }
  impl_->plan(0, 0);
}

DistributedSampler::DistributedSampler(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

DistributedSampler DistributedSampler::clone() const {
  return DistributedSampler(std::make_shared<Impl>(*impl_));
}

void DistributedSampler::set_epoch(std::int64_t epoch) {
  if (impl_->resume_pending && epoch == impl_->epoch) return;  // Note [Resume through reset]
  impl_->resume_pending = false;
  impl_->plan(epoch, 0);
}

void DistributedSampler::reset(torch::optional<std::size_t> new_size) {
  if (new_size.has_value() && *new_size != impl_->dataset_size) {
    impl_->dataset_size = *new_size;
    impl_->resume_pending = false;
    impl_->plan(impl_->epoch, 0);
    return;
  }
  if (impl_->resume_pending) {  // Note [Resume through reset]
    impl_->resume_pending = false;
    impl_->cursor = 0;
    return;
  }
  if (impl_->offset == 0) {
    impl_->cursor = 0;  // the plan is already the whole epoch; skip the randperm
  } else {
    impl_->plan(impl_->epoch, 0);
  }
}

torch::optional<std::vector<std::size_t>> DistributedSampler::next(std::size_t batch_size) {
  if (batch_size == 0) {
    throw ConfigError("cohort: DistributedSampler::next: batch_size must be >= 1, got 0");
  }
  auto& impl = *impl_;
  if (impl.cursor >= impl.shard.size()) return torch::nullopt;
  impl.resume_pending = false;
  const std::size_t n = std::min(batch_size, impl.shard.size() - impl.cursor);
  const auto begin = impl.shard.begin() + static_cast<std::ptrdiff_t>(impl.cursor);
  std::vector<std::size_t> batch(begin, begin + static_cast<std::ptrdiff_t>(n));
  impl.cursor += n;
  return batch;
}

SamplerState DistributedSampler::state() const { return impl_->state_at(impl_->cursor); }

SamplerState DistributedSampler::state_after(std::size_t local_samples) const {
  if (local_samples > impl_->shard.size()) {
    throw ConfigError(fmt::format(
        "cohort: DistributedSampler::state_after: local_samples is {} but rank {} has only {} samples in "
        "this plan; count the samples trained since the last set_epoch()/loader begin()",
        local_samples, impl_->options.rank(), impl_->shard.size()));
  }
  return impl_->state_at(local_samples);
}

void DistributedSampler::load_state(const SamplerState& state) {
  auto& impl = *impl_;
  const auto size = static_cast<std::int64_t>(impl.dataset_size);
  if (state.dataset_size != size) {
    throw ConfigError(fmt::format(
        "cohort: DistributedSampler::load_state: the state's dataset_size is {} but this sampler's is {}; "
        "resume over the dataset the checkpoint was taken with",
        state.dataset_size, size));
  }
  if (state.shuffle != impl.options.shuffle()) {
    throw ConfigError(fmt::format(
        "cohort: DistributedSampler::load_state: the state's shuffle is {} but this sampler's is {}; "
        "construct the sampler with DistributedSamplerOptions(...).shuffle({})",
        bool_text(state.shuffle), bool_text(impl.options.shuffle()), bool_text(state.shuffle)));
  }
  if (state.consumed < 0 || state.consumed > size) {
    throw ConfigError(fmt::format(
        "cohort: DistributedSampler::load_state: the state's consumed is {} but must be in [0, {}] "
        "(this sampler's dataset_size); the checkpoint is damaged or was not written by state()",
        state.consumed, size));
  }
  impl.options.seed(state.seed);
  impl.plan(state.epoch, static_cast<std::size_t>(state.consumed));
  impl.resume_pending = true;
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  const SamplerState s = state();
  // IValue has no unsigned integer; the seed travels bit for bit as an int64.
  archive.write(kKeys[0], c10::IValue(static_cast<std::int64_t>(s.seed)));
  archive.write(kKeys[1], c10::IValue(s.shuffle));
  archive.write(kKeys[2], c10::IValue(s.epoch));
  archive.write(kKeys[3], c10::IValue(s.dataset_size));
  archive.write(kKeys[4], c10::IValue(s.consumed));
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  c10::IValue values[5];
  for (std::size_t i = 0; i < 5; ++i) {
    if (!archive.try_read(kKeys[i], values[i])) {
      throw ConfigError(fmt::format(
          "cohort: DistributedSampler::load: the archive has no '{}'; load an archive written by "
          "DistributedSampler::save()",
          kKeys[i]));
    }
  }
  SamplerState s;
  s.seed = static_cast<std::uint64_t>(values[0].toInt());
  s.shuffle = values[1].toBool();
  s.epoch = values[2].toInt();
  s.dataset_size = values[3].toInt();
  s.consumed = values[4].toInt();
  load_state(s);
}

std::size_t DistributedSampler::size() const { return impl_->shard.size(); }
std::int64_t DistributedSampler::epoch() const { return impl_->epoch; }
std::size_t DistributedSampler::dataset_size() const { return impl_->dataset_size; }
const DistributedSamplerOptions& DistributedSampler::options() const { return impl_->options; }

}  // namespace cohort::data
