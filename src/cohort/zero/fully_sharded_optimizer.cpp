#include "cohort/zero/fully_sharded_optimizer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "cohort/compat/optimizer.h"
#include "cohort/errors.h"
#include "cohort/zero/state_bytes.h"

namespace cohort::zero {
namespace {

using State = torch::optim::OptimizerParamState;
using Entries = std::map<std::string, c10::IValue>;

// A state's entries by name, read through its own serialize() (Note [ZeRO-3
// optimizer state]).
Entries entries_of(const State& state) {
  torch::serialize::OutputArchive out;
  state.serialize(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  Entries entries;
  for (const auto& key : in.keys()) {
    c10::IValue value;
    if (in.try_read(key, value)) entries.emplace(key, std::move(value));
  }
  return entries;
}

// A copy of `like` whose entries are replaced by `entries`.
std::unique_ptr<State> state_from(const State& like, const Entries& entries) {
  torch::serialize::OutputArchive out;
  for (const auto& [key, value] : entries) out.write(key, value);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  auto state = like.clone();
  state->serialize(in);
  return state;
}

const State* find_state(const torch::optim::Optimizer& optimizer, const at::Tensor& p) {
  auto it = optimizer.state().find(compat::optimizer_state_key(p));
  return it == optimizer.state().end() ? nullptr : it->second.get();
}

void set_state(torch::optim::Optimizer& optimizer, const at::Tensor& p, std::unique_ptr<State> state) {
  optimizer.state()[compat::optimizer_state_key(p)] = std::move(state);
}

// A placeholder until the constructor refuses a missing optimizer.
std::unique_ptr<torch::optim::OptimizerOptions> defaults_of(const torch::optim::Optimizer* optimizer) {
  if (optimizer) return optimizer->defaults().clone();
  return std::make_unique<torch::optim::SGDOptions>(0.0);
}

}  // namespace

struct FullyShardedOptimizer::Made {
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> local;
};

FullyShardedOptimizer::FullyShardedOptimizer(FullyShardedModel model, OptimizerFactory make)
    // `make` is copied, not moved: the arguments' order of evaluation is unspecified.
    : FullyShardedOptimizer(model, make, Made{model.parameters(), make ? make(model.parameters()) : nullptr}) {}

FullyShardedOptimizer::FullyShardedOptimizer(FullyShardedModel model, OptimizerFactory make, Made made)
    : Optimizer({torch::optim::OptimizerParamGroup(made.params)},
                defaults_of(made.local.get())),
      model_(std::move(model)),
      make_(std::move(make)),
      local_(std::move(made.local)) {
  if (!local_) throw ConfigError("cohort FullyShardedOptimizer: the optimizer factory is missing or returned null");
  if (dynamic_cast<torch::optim::LBFGS*>(local_.get()))
    throw ConfigError("cohort FullyShardedOptimizer: LBFGS mixes every element of its parameters in each step, so "
                      "it cannot step shards apart; use SGD, Adam, AdamW, Adagrad or RMSprop");
  if (local_->param_groups().size() != 1)
    throw ConfigError("cohort FullyShardedOptimizer: the factory must make one parameter group over the shards "
                      "it is given");
}

// Note [Unused parameters under ZeRO-3]: the elements of a shard that belong to a
// parameter without a gradient keep their values and their state through the step.
// A state the step creates is compared with what a fresh optimizer makes of zeros:
// the initial state (Adam's moments of zero, SGD's momentum of zero, Adagrad's
// initial accumulator), which one process gives the parameter when it first trains.
struct FullyShardedOptimizer::Kept {
  at::Tensor shard;
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  std::vector<at::Tensor> values;
  Entries state;  // before the step (or initial); empty when it has none
};

at::Tensor FullyShardedOptimizer::step(LossClosure closure) {
  auto& schedule = model_.schedule();
  schedule.raise_recorded_failure();
  schedule.check_trainable("FullyShardedOptimizer::step()");
  local_->param_groups()[0].set_options(param_groups()[0].options().clone());
  std::vector<Kept> kept;
  for (std::size_t f = 0; f < schedule.flats().size(); ++f) {
    auto ranges = schedule.unused_ranges(f);
    if (ranges.empty()) continue;
    Kept k{schedule.flats()[f]->shard(), std::move(ranges), {}, {}};
    for (const auto& [from, n] : k.ranges) k.values.push_back(k.shard.detach().narrow(0, from, n).clone());
    if (const auto* state = find_state(*local_, k.shard)) {
      k.state = entries_of(*state);
    } else {
      auto zero = at::zeros_like(k.shard).requires_grad_(true);
      zero.mutable_grad() = at::zeros_like(zero);
      auto fresh = make_({zero});
      fresh->param_groups()[0].set_options(param_groups()[0].options().clone());
      fresh->step();
      if (const auto* initial = find_state(*fresh, zero)) k.state = entries_of(*initial);
    }
    kept.push_back(std::move(k));
  }
  auto loss = local_->step(std::move(closure));
  at::NoGradGuard no_grad;
  for (auto& k : kept) {
    for (std::size_t r = 0; r < k.ranges.size(); ++r)
      k.shard.detach().narrow(0, k.ranges[r].first, k.ranges[r].second).copy_(k.values[r]);
    const auto* state = find_state(*local_, k.shard);
    if (!state || k.state.empty()) continue;
    auto entries = entries_of(*state);
    for (auto& [key, value] : entries) {
      auto before = k.state.find(key);
      if (!value.isTensor() || before == k.state.end() || !before->second.isTensor() ||
          value.toTensor().sizes() != k.shard.sizes())
        continue;
      auto now = value.toTensor();
      for (const auto& [from, n] : k.ranges) now.narrow(0, from, n).copy_(before->second.toTensor().narrow(0, from, n));
    }
    set_state(*local_, k.shard, state_from(*state, entries));
  }
  schedule.invalidate_all();  // Note [Fresh gathers]
  return loss;
}

std::vector<at::Tensor> FullyShardedOptimizer::stand_ins() const {
  const auto& flats = model_.schedule().flats();
  std::vector<at::Tensor> out;
  for (const auto& [f, i] : model_.schedule().whole_order()) {
    const auto& flat = *flats[f];
    out.push_back(at::zeros(flat.shape(i), flat.shard().options().requires_grad(false)));
  }
  return out;
}

// Note [ZeRO-3 optimizer state]: every rank takes part in the same all-gathers, in
// flat order and key order; only rank `to` keeps what they bring.
void FullyShardedOptimizer::gather_state(int to) const {
  auto group = model_.schedule().group();
  if (to < 0 || to >= group.size())
    throw ConfigError(fmt::format("cohort FullyShardedOptimizer: gather_state({}) names no rank of a group of {}", to,
                                  group.size()));
  gathered_.reset();
  const auto& flats = model_.schedule().flats();
  const auto whole_params = stand_ins();
  std::unique_ptr<torch::optim::Optimizer> whole;
  if (group.rank() == to) {
    whole = make_(whole_params);
    whole->param_groups()[0].set_options(param_groups()[0].options().clone());
  }
  const auto& order = model_.schedule().whole_order();
  for (std::size_t f = 0; f < flats.size(); ++f) {
    const auto& flat = *flats[f];
    if (!flat.trainable()) continue;
    const auto* state = find_state(*local_, flat.shard());
    // Ranks agree whether this flat has state (it has after the first step).
    auto has = at::full({1}, state ? 1 : 0, at::TensorOptions().dtype(at::kLong).device(flat.shard().device()));
    const auto all = group.all_gather(has);
    std::int64_t with = 0;
    for (const auto& a : all) with += a.item<std::int64_t>();
    if (with == 0) continue;
    if (with != group.size())
      throw ConfigError(fmt::format("cohort FullyShardedOptimizer: {} of {} ranks hold optimizer state for the "
                                    "parameters of '{}'; step() on every rank, the same number of times",
                                    with, group.size(), flat.names()[0]));
    auto entries = entries_of(*state);
    Entries full;  // the shard-shaped tensors, gathered whole
    for (auto& [key, value] : entries) {
      if (!value.isTensor() || value.toTensor().sizes() != flat.shard().sizes()) continue;
      auto parts = group.all_gather(value.toTensor().contiguous());
      if (whole) full[key] = at::cat(parts);
    }
    if (!whole) continue;
    for (std::size_t k = 0; k < order.size(); ++k) {
      if (order[k].first != f) continue;
      const auto i = order[k].second;
      Entries mine = entries;
      for (const auto& [key, value] : full)
        mine[key] = value.toTensor().narrow(0, flat.offset(i), flat.numel(i)).reshape(flat.shape(i)).clone();
      set_state(*whole, whole_params[k], state_from(*state, mine));
    }
  }
  gathered_ = std::move(whole);
}

void FullyShardedOptimizer::gather_state_for_save(int writer) const {
  // The same answer on every rank: full_parameters() is collective.
  for (const auto& flat : model_.schedule().flats())
    if (!flat->holds_state())
      throw ConfigError(fmt::format(
          "cohort FullyShardedOptimizer (rank {}): Checkpointer::save was called outside full_parameters(), where "
          "the model's parameters hold no values ('{}' is empty): the checkpoint would hold an empty model. Fix: "
          "save inside {{ auto full = sharded.full_parameters(); ckpt.save(...); }}",
          model_.schedule().group().rank(), flat->names()[0]));
  const auto& ranks = model_.schedule().group().global_ranks();
  const auto it = std::find(ranks.begin(), ranks.end(), writer);
  if (it == ranks.end())
    throw ConfigError(fmt::format("cohort FullyShardedOptimizer: the checkpoint's writer (global rank {}) is not a "
                                  "rank of the model's group; give the Checkpointer the group given to fully_shard()",
                                  writer));
  gather_state(static_cast<int>(it - ranks.begin()));
}

void FullyShardedOptimizer::release_gathered_state() const { gathered_.reset(); }

void FullyShardedOptimizer::save(torch::serialize::OutputArchive& archive) const {
  if (!gathered_)
    throw ConfigError(fmt::format("cohort FullyShardedOptimizer on rank {}: save() writes the whole state, which is "
                                  "spread over the ranks\n  fix: call gather_state({}) on every rank first "
                                  "(Checkpointer::save does)",
                                  model_.schedule().group().rank(), model_.schedule().group().rank()));
  gathered_->save(archive);
}

void FullyShardedOptimizer::load(torch::serialize::InputArchive& archive) {
  // Every rank holds the whole state here for a moment (docs/zero.md, Limits).
  const auto whole_params = stand_ins();
  auto whole = make_(whole_params);
  whole->load(archive);
  param_groups()[0].set_options(whole->param_groups()[0].options().clone());
  const auto& flats = model_.schedule().flats();
  const auto& order = model_.schedule().whole_order();
  const int rank = model_.schedule().group().rank();
  auto fresh = make_(model_.parameters());
  for (std::size_t f = 0; f < flats.size(); ++f) {
    const auto& flat = *flats[f];
    if (!flat.trainable()) continue;
    const State* like = nullptr;
    std::size_t missing = 0, members = 0;
    std::map<std::string, at::Tensor> laid;  // each tensor entry, flat and padded
    Entries scalars;
    for (std::size_t k = 0; k < order.size(); ++k) {
      if (order[k].first != f) continue;
      ++members;
      const auto i = order[k].second;
      const auto* state = find_state(*whole, whole_params[k]);
      if (!state) {
        ++missing;
        continue;
      }
      like = state;
      for (auto& [key, value] : entries_of(*state)) {
        if (value.isTensor() && value.toTensor().sizes() == whole_params[k].sizes()) {
          auto& out = laid[key];
          if (!out.defined()) out = at::zeros({flat.padded_numel()}, value.toTensor().options());
          out.narrow(0, flat.offset(i), flat.numel(i)).copy_(value.toTensor().reshape({-1}));
        } else {
          scalars[key] = value;
        }
      }
    }
    if (!like) continue;
    if (missing > 0)
      throw ConfigError(fmt::format("cohort FullyShardedOptimizer: the saved state covers {} of the {} parameters "
                                    "sharded together with '{}'; it was saved by another optimizer or model",
                                    members - missing, members, flat.names()[0]));
    Entries mine = scalars;
    for (const auto& [key, value] : laid)
      mine[key] = value.narrow(0, rank * flat.chunk_numel(), flat.chunk_numel()).clone();
    set_state(*fresh, flat.shard(), state_from(*like, mine));
  }
  fresh->param_groups()[0].set_options(param_groups()[0].options().clone());
  local_ = std::move(fresh);
  model_.schedule().invalidate_all();
}

std::int64_t FullyShardedOptimizer::local_state_bytes() const { return optimizer_state_bytes(*local_); }

}  // namespace cohort::zero
