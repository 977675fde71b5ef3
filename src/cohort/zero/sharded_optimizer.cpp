#include "cohort/zero/sharded_optimizer.h"

#include <torch/optim/lbfgs.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <iostream>
#include <sstream>
#include <unordered_set>

#include <fmt/format.h>

#include "cohort/compat/optimizer.h"
#include "cohort/ddp/broadcast.h"
#include "cohort/ddp/replica_check.h"
#include "cohort/errors.h"
#include "cohort/zero/partition.h"
#include "cohort/zero/state_bytes.h"

namespace cohort::zero {
namespace {

// Each parameter once, in the order given (a module lists a shared one twice).
std::vector<at::Tensor> unique(const std::vector<at::Tensor>& parameters) {
  std::unordered_set<const void*> seen;
  std::vector<at::Tensor> out;
  for (const auto& p : parameters)
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

std::vector<ddp::ParamDescription> describe(const std::vector<at::Tensor>& parameters,
                                            const ShardedOptimizerOptions& options, const std::string& settings) {
  std::vector<ddp::ParamDescription> out;
  out.push_back({"ShardedOptimizerOptions::bucket_cap_bytes", {options.bucket_cap_bytes()}, "-"});
  out.push_back({"ShardedOptimizerOptions::shard_gradients", {options.shard_gradients() ? 1 : 0}, "-"});
  out.push_back({"the optimizer's settings (a digest)",
                 {static_cast<std::int64_t>(std::hash<std::string>()(settings) & 0x7fffffffffffffffULL)}, "-"});
  for (std::size_t i = 0; i < parameters.size(); ++i)
    out.push_back({fmt::format("parameter {}", i), parameters[i].sizes().vec(),
                   std::string(parameters[i].dtype().name())});
  return out;
}

std::string serialized(const torch::optim::Optimizer* optimizer) {
  if (optimizer == nullptr) return {};
  torch::serialize::OutputArchive archive;
  optimizer->save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

// Moves the states of `params` from `from` into `to` (the same tensors are the keys).
void move_states(torch::optim::Optimizer& from, torch::optim::Optimizer& to, const std::vector<at::Tensor>& params) {
  for (const auto& p : params) {
    auto it = from.state().find(compat::optimizer_state_key(p));
    if (it != from.state().end()) to.state()[it->first] = std::move(it->second);
  }
}

}  // namespace

// The factory's optimizer over every parameter, made before the base class: its
// defaults become the base's, its settings go into the replica check, and what is
// wrong with it is raised only after that check, so that every rank raises it.
struct ShardedOptimizer::Probe {
  std::vector<at::Tensor> parameters;
  std::unique_ptr<torch::optim::OptimizerOptions> defaults;
  std::string settings;  // the defaults, serialized
  std::string problem;

  Probe(const std::vector<at::Tensor>& given, const OptimizerFactory& make) : parameters(unique(given)) {
    std::unique_ptr<torch::optim::Optimizer> probe;
    if (!make)
      problem = "no optimizer factory was given";
    else if (!(probe = make(parameters)))
      problem = "the optimizer factory returned null";
    else if (dynamic_cast<torch::optim::LBFGS*>(probe.get()))
      problem = "LBFGS evaluates its closure several times per step, on the ranks that own parameters only; "
                "ShardedOptimizer evaluates it once, on every rank";
    if (!probe) {
      defaults = std::make_unique<torch::optim::SGDOptions>(0.0);  // a placeholder until the refusal
      return;
    }
    defaults = probe->defaults().clone();
    torch::serialize::OutputArchive archive;
    defaults->serialize(archive);
    std::ostringstream out;
    archive.save_to(out);
    settings = out.str();
  }
};

ShardedOptimizer::ShardedOptimizer(std::vector<at::Tensor> parameters, comm::Group group, OptimizerFactory make,
                                   ShardedOptimizerOptions options)
    // `make` is copied, not moved: the arguments' order of evaluation is unspecified.
    : ShardedOptimizer(Probe(parameters, make), std::move(group), make, std::move(options)) {}

ShardedOptimizer::ShardedOptimizer(Probe probe, comm::Group group, OptimizerFactory make,
                                   ShardedOptimizerOptions options)
    : Optimizer(probe.parameters, std::move(probe.defaults)),
      group_(std::move(group)),
      make_(std::move(make)),
      options_(std::move(options)) {
  const auto& all = all_params();
  // Note [Replica check without hangs]: first, while every rank still agrees to talk.
  if (options_.check_replicas())
    ddp::verify_replicas(group_, describe(all, options_, probe.settings),
                         {"cohort ShardedOptimizer", "what each rank passed (its parameters, options or optimizer "
                          "settings)",
                          "pass the same model's parameters, the same optimizer settings and the same "
                          "ShardedOptimizerOptions on every rank"},
                         all.empty() ? at::Device(at::kCPU) : all.front().device());
  if (!probe.problem.empty()) throw ConfigError("cohort ShardedOptimizer: " + probe.problem);
  if (options_.bucket_cap_bytes() < 1)
    throw ConfigError(fmt::format("cohort ShardedOptimizer: bucket_cap_bytes must be at least 1, got {}",
                                  options_.bucket_cap_bytes()));
  for (const auto& p : all) trainable_.push_back(p.requires_grad());
  std::vector<std::int64_t> bytes;
  for (const auto& p : all) bytes.push_back(static_cast<std::int64_t>(p.numel()) * p.element_size());
  owner_ = partition_by_size(bytes, group_.size());
  shard_ = params_of(group_.rank());
  if (!shard_.empty()) local_ = make_(shard_);
  // Note [ZeRO-1 step]: per owner, parameters in order, a new bucket where the
  // dtype or device changes or the cap would be passed. The same on every rank.
  for (int r = 0; r < group_.size(); ++r) {
    Bucket bucket{r, {}};
    std::int64_t size = 0;
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (owner_[i] != r) continue;
      const bool fits = bucket.params.empty() ||
                        (all[i].dtype() == all[bucket.params[0]].dtype() &&
                         all[i].device() == all[bucket.params[0]].device() &&
                         size + bytes[i] <= options_.bucket_cap_bytes());
      if (!fits) {
        buckets_.push_back(std::move(bucket));
        bucket = Bucket{r, {}};
        size = 0;
      }
      bucket.params.push_back(i);
      size += bytes[i];
    }
    if (!bucket.params.empty()) buckets_.push_back(std::move(bucket));
  }
  if (options_.shard_gradients()) {
    // Without DDP nobody else makes the replicas start equal.
    ddp::broadcast_coalesced(group_, all, 0);
    sharder_ = std::make_unique<GradientSharder>(all, owner_, group_, options_.bucket_cap_bytes());
  }
}

ShardedOptimizer::~ShardedOptimizer() = default;

// The base's first (only) group: Optimizer::parameters() warns of its removal.
const std::vector<at::Tensor>& ShardedOptimizer::all_params() const { return param_groups()[0].params(); }

std::vector<at::Tensor> ShardedOptimizer::params_of(int rank) const {
  std::vector<at::Tensor> out;
  const auto& all = all_params();
  for (std::size_t i = 0; i < all.size(); ++i)
    if (owner_[i] == rank) out.push_back(all[i]);
  return out;
}

at::Tensor ShardedOptimizer::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable(true);
    loss = closure();
  }
  check_trainable();
  if (sharder_) sharder_->check_before_step();
  if (local_) {
    // The options of this optimizer's group are the ones in force (a scheduler or
    // set_lr() changes them); the shard's optimizer follows.
    local_->param_groups()[0].set_options(param_groups()[0].options().clone());
    local_->step();
  }
  broadcast_parameters();
  return loss;
}

// Note [Unfreezing after construction]
// A parameter frozen when the optimizer was built has no gradient reduction: under
// ZeRO-2 the sharder has no hook on it, under ZeRO-1 DDP (built before) leaves it
// out of its buckets. Unfrozen later, its owner would step it with its own local
// gradient, not the average. Freezing one is fine: it gets no gradient, and the
// optimizer skips it, as one process does.
void ShardedOptimizer::check_trainable() const {
  const auto& all = all_params();
  for (std::size_t i = 0; i < all.size(); ++i)
    if (!trainable_[i] && all[i].requires_grad())
      throw ConfigError(fmt::format(
          "cohort ShardedOptimizer (rank {}): parameter {} (shape {}) was frozen (requires_grad false) when the "
          "optimizer{} was built, and requires grad now. Its gradient would not be averaged over the ranks: its "
          "owner would step it with one rank's gradient. Fix: set requires_grad on every parameter before "
          "building {}, or build {} again after unfreezing",
          group_.rank(), i, c10::str(all[i].sizes()), sharder_ ? "" : " (and the DDP wrapper)",
          sharder_ ? "the ShardedOptimizer" : "DDP and the ShardedOptimizer",
          sharder_ ? "it" : "both"));
}

void ShardedOptimizer::broadcast_parameters() {
  if (group_.size() == 1) return;
  at::NoGradGuard no_grad;
  const auto& all = all_params();
  const int rank = group_.rank();
  struct InFlight {
    const Bucket* bucket;
    at::Tensor flat;  // undefined when the parameter itself travelled
    comm::Pending pending;
  };
  auto land = [&](InFlight& f) {
    f.pending.wait();
    if (!f.flat.defined() || f.bucket->owner == rank) return;
    std::int64_t offset = 0;
    for (auto i : f.bucket->params) {
      const auto n = all[i].numel();
      all[i].detach().copy_(f.flat.narrow(0, offset, n).view_as(all[i]));
      offset += n;
    }
  };
  // At most two buckets in flight: one travels while the one before is unpacked.
  std::deque<InFlight> flying;
  for (const auto& b : buckets_) {
    at::Tensor flat;
    bool direct = b.params.size() == 1 && all[b.params[0]].is_contiguous();
    if (direct) {
      flat = all[b.params[0]].detach().view(-1);
    } else if (b.owner == rank) {
      std::vector<at::Tensor> pieces;
      for (auto i : b.params) pieces.push_back(all[i].detach().reshape(-1));
      flat = at::cat(pieces);
    } else {
      std::int64_t n = 0;
      for (auto i : b.params) n += all[i].numel();
      flat = at::empty({n}, all[b.params[0]].options());
    }
    auto pending = group_.broadcast_async(flat, b.owner);
    flying.push_back({&b, direct ? at::Tensor() : flat, std::move(pending)});
    if (flying.size() >= 2) {
      land(flying.front());
      flying.pop_front();
    }
  }
  for (auto& f : flying) land(f);
}

std::unique_ptr<torch::optim::Optimizer> ShardedOptimizer::whole_optimizer() const {
  auto whole = make_(all_params());
  whole->param_groups()[0].set_options(param_groups()[0].options().clone());
  return whole;
}

// Note [Gathered for saving]: each rank serializes its shard's optimizer in the
// wrapped optimizer's own format; the bytes travel to `to` (their sizes by
// all_gather, then point to point). `to` loads each into an optimizer over that
// rank's shard and moves the per-parameter states into one optimizer over every
// parameter, whose save() is the wrapped optimizer's: the file loads into a plain
// optimizer too. Memory on `to`: the whole state, once.
void ShardedOptimizer::gather_state(int to) const {
  if (to < 0 || to >= group_.size())
    throw ConfigError(fmt::format("cohort ShardedOptimizer: gather_state({}) names no rank of a group of {}", to,
                                  group_.size()));
  gathered_.reset();
  gather_error_.clear();
  const std::string mine = serialized(local_.get());
  const auto device = all_params().empty() ? at::Device(at::kCPU) : all_params()[0].device();
  auto sizes = group_.all_gather(at::tensor({static_cast<std::int64_t>(mine.size())}, at::kLong).to(device));
  if (group_.rank() != to) {
    if (!mine.empty())
      group_.send(at::from_blob(const_cast<char*>(mine.data()), {static_cast<std::int64_t>(mine.size())}, at::kByte)
                      .clone()
                      .to(device),
                  to);
    return;
  }
  // Every shard is received before any is merged: a merge that fails must not leave
  // a sender waiting (the failure surfaces in save(), Note [Gathered for saving]).
  std::vector<std::string> shards(static_cast<std::size_t>(group_.size()));
  for (int r = 0; r < group_.size(); ++r) {
    const auto size = sizes[static_cast<std::size_t>(r)].item<std::int64_t>();
    if (r == to || size == 0) continue;
    auto buffer = at::empty({size}, at::TensorOptions().dtype(at::kByte).device(device));
    group_.recv(buffer, r);
    buffer = buffer.cpu();
    shards[static_cast<std::size_t>(r)].assign(static_cast<const char*>(buffer.data_ptr()),
                                               static_cast<std::size_t>(size));
  }
  shards[static_cast<std::size_t>(to)] = mine;
  try {
    auto whole = whole_optimizer();
    for (int r = 0; r < group_.size(); ++r) {
      const auto& bytes = shards[static_cast<std::size_t>(r)];
      if (bytes.empty()) continue;
      const auto params = params_of(r);
      auto part = make_(params);
      torch::serialize::InputArchive archive;
      archive.load_from(bytes.data(), bytes.size());
      part->load(archive);
      move_states(*part, *whole, params);
    }
    gathered_ = std::move(whole);
  } catch (const std::exception& e) {
    gather_error_ = e.what();
  }
}

void ShardedOptimizer::gather_state_for_save(int writer) const {
  const auto& ranks = group_.global_ranks();
  const auto it = std::find(ranks.begin(), ranks.end(), writer);
  if (it == ranks.end())
    throw ConfigError(fmt::format("cohort ShardedOptimizer: the checkpoint's writer (global rank {}) is not a rank "
                                  "of the optimizer's group '{}'; give the Checkpointer a group whose first rank "
                                  "is in it",
                                  writer, group_.name()));
  gather_state(static_cast<int>(it - ranks.begin()));
}

void ShardedOptimizer::release_gathered_state() const {
  gathered_.reset();
  gather_error_.clear();
}

void ShardedOptimizer::save(torch::serialize::OutputArchive& archive) const {
  if (!gather_error_.empty())
    throw ConfigError(fmt::format("cohort ShardedOptimizer on rank {}: the shards' states could not be merged for "
                                  "saving: {}",
                                  group_.rank(), gather_error_));
  if (!gathered_)
    throw ConfigError(fmt::format("cohort ShardedOptimizer on rank {}: save() writes the whole state, which is "
                                  "spread over the ranks\n  fix: call gather_state({}) on every rank first "
                                  "(Checkpointer::save does)",
                                  group_.rank(), group_.rank()));
  gathered_->save(archive);
}

void ShardedOptimizer::load(torch::serialize::InputArchive& archive) {
  // Note: every rank holds the whole state here for a moment (docs/zero.md, Limits).
  auto whole = whole_optimizer();
  whole->load(archive);
  // LibTorch 1.13 restores no group options from an archive (so this keeps ours);
  // versions that do, bring back the saved ones, as a plain optimizer would.
  param_groups()[0].set_options(whole->param_groups()[0].options().clone());
  if (shard_.empty()) return;
  local_ = make_(shard_);
  move_states(*whole, *local_, shard_);
}

checkpoint::ShardLayout ShardedOptimizer::shard_layout() const { return {group_.size(), owner_}; }

std::string ShardedOptimizer::shard_bytes() const {
  // The options in force (set_lr(), a scheduler) reach the shard's optimizer only in
  // step(); the file holds them as they are now, as a gathered save does.
  if (local_) local_->param_groups()[0].set_options(param_groups()[0].options().clone());
  return serialized(local_.get());
}

// Note [Resharding]: saved shard k holds an optimizer over the parameters that k
// owned then, in order. Each saved shard that holds a parameter this rank owns now
// is loaded into an optimizer over k's parameters, and the states of this rank's
// parameters move into a fresh shard optimizer; the others are dropped with it. So
// a rank reads about 1/N of the state, never the whole. A rank that owns nothing
// reads nothing and keeps the group options in force.
void ShardedOptimizer::load_shards(const checkpoint::ShardLayout& saved,
                                   const std::function<std::string(int)>& shard) {
  const auto& all = all_params();
  if (saved.owner.size() != all.size())
    throw ConfigError(fmt::format("cohort ShardedOptimizer: the sharded state was saved for {} parameters and this "
                                  "optimizer has {}; it was saved with another model",
                                  saved.owner.size(), all.size()));
  for (int o : saved.owner)
    if (o < 0 || o >= saved.world_size)
      throw DataError(fmt::format("cohort ShardedOptimizer: the sharded state names shard {} of {}; its layout is "
                                  "corrupt",
                                  o, saved.world_size));
  auto fresh = shard_.empty() ? nullptr : make_(shard_);
  std::unique_ptr<torch::optim::OptimizerOptions> options;
  for (int k = 0; k < saved.world_size; ++k) {
    std::vector<at::Tensor> theirs;
    bool wanted = false;
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (saved.owner[i] != k) continue;
      theirs.push_back(all[i]);
      wanted = wanted || owner_[i] == group_.rank();
    }
    if (!wanted) continue;
    const std::string bytes = shard(k);
    auto part = make_(theirs);
    // Where LibTorch restores no options from an archive (1.13), the ones in force
    // stay, as in load(); where it does, the saved ones come back.
    part->param_groups()[0].set_options(param_groups()[0].options().clone());
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(bytes.data(), bytes.size());
      part->load(archive);
    } catch (const c10::Error& e) {
      const std::string why = e.what_without_backtrace();
      throw ConfigError(fmt::format("cohort ShardedOptimizer: shard {} of the saved state does not fit this "
                                    "optimizer ({}); it was saved with another optimizer or model",
                                    k, why.substr(0, why.find('\n'))));
    }
    if (!options) options = part->param_groups()[0].options().clone();
    move_states(*part, *fresh, shard_);
  }
  // As load(): the saved group options where LibTorch restores them (not 1.13).
  if (options) param_groups()[0].set_options(std::move(options));
  local_ = std::move(fresh);
}

double ShardedOptimizer::clip_grad_norm(double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : all_params())
    if (p.grad().defined()) grads.push_back(p.grad());
  const auto device = all_params().empty() ? at::Device(at::kCPU) : all_params()[0].device();
  auto squares = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const auto& g : grads) squares += g.to(at::kDouble).square().sum();
  // With sharded gradients each rank holds its owners' share: the squares add up.
  if (sharder_ && group_.size() > 1) group_.all_reduce(squares);
  const double norm = std::sqrt(squares.item<double>());
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1)
    for (auto& g : grads) g.mul_(coefficient);
  return norm;
}

ShardedOptimizer::NoSync::NoSync(GradientSharder& sharder) : sharder_(sharder) { sharder_.set_sync(false); }

ShardedOptimizer::NoSync::~NoSync() {
  try {
    sharder_.set_sync(true);
  } catch (const std::exception& e) {
    // A destructor must not throw; the next backward would not synchronise, so say so.
    std::cerr << "cohort ShardedOptimizer: " << e.what() << std::endl;
  }
}

ShardedOptimizer::NoSync ShardedOptimizer::no_sync() {
  if (!sharder_)
    throw ConfigError("cohort ShardedOptimizer: no_sync() is for shard_gradients(true), where the optimizer "
                      "reduces the gradients; under DDP, use the DDP wrapper's no_sync()");
  return NoSync(*sharder_);
}

void ShardedOptimizer::set_lr(double lr) { param_groups()[0].options().set_lr(lr); }

double ShardedOptimizer::lr() const { return param_groups()[0].options().get_lr(); }

std::int64_t ShardedOptimizer::local_state_bytes() const { return local_ ? optimizer_state_bytes(*local_) : 0; }

}  // namespace cohort::zero
