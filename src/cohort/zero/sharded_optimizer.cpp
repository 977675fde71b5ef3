#include "cohort/zero/sharded_optimizer.h"

#include <torch/serialize.h>

#include <deque>
#include <sstream>
#include <unordered_set>

#include <fmt/format.h>

#include "cohort/compat/optimizer.h"
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

std::unique_ptr<torch::optim::OptimizerOptions> defaults_of(const OptimizerFactory& make,
                                                            const std::vector<at::Tensor>& parameters) {
  if (!make) throw ConfigError("cohort ShardedOptimizer: no optimizer factory was given");
  auto probe = make(parameters);
  if (!probe) throw ConfigError("cohort ShardedOptimizer: the optimizer factory returned null");
  return probe->defaults().clone();
}

std::vector<ddp::ParamDescription> describe(const std::vector<at::Tensor>& parameters,
                                            const ShardedOptimizerOptions& options) {
  std::vector<ddp::ParamDescription> out;
  out.push_back({"ShardedOptimizerOptions::bucket_cap_bytes", {options.bucket_cap_bytes()}, "-"});
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

ShardedOptimizer::ShardedOptimizer(std::vector<at::Tensor> parameters, comm::Group group, OptimizerFactory make,
                                   ShardedOptimizerOptions options)
    : Optimizer(unique(parameters), defaults_of(make, unique(parameters))),
      group_(std::move(group)),
      make_(std::move(make)),
      options_(std::move(options)) {
  if (options_.bucket_cap_bytes() < 1)
    throw ConfigError(fmt::format("cohort ShardedOptimizer: bucket_cap_bytes must be at least 1, got {}",
                                  options_.bucket_cap_bytes()));
  const auto& all = Optimizer::parameters();
  if (options_.check_replicas())
    ddp::verify_replicas(group_, describe(all, options_),
                         {"cohort ShardedOptimizer", "what each rank passed (its parameters or options)",
                          "pass the same model's parameters and the same ShardedOptimizerOptions on every rank"});
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
}

ShardedOptimizer::~ShardedOptimizer() = default;

std::vector<at::Tensor> ShardedOptimizer::params_of(int rank) const {
  std::vector<at::Tensor> out;
  const auto& all = Optimizer::parameters();
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
  if (local_) {
    // The options of this optimizer's group are the ones in force (a scheduler or
    // set_lr() changes them); the shard's optimizer follows.
    local_->param_groups()[0].set_options(param_groups()[0].options().clone());
    local_->step();
  }
  broadcast_parameters();
  return loss;
}

void ShardedOptimizer::broadcast_parameters() {
  if (group_.size() == 1) return;
  at::NoGradGuard no_grad;
  const auto& all = Optimizer::parameters();
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
  auto whole = make_(Optimizer::parameters());
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
  const std::string mine = serialized(local_.get());
  const auto device = Optimizer::parameters().empty() ? at::Device(at::kCPU) : Optimizer::parameters()[0].device();
  auto sizes = group_.all_gather(at::tensor({static_cast<std::int64_t>(mine.size())}, at::kLong).to(device));
  auto bytes_tensor = [&](const std::string& s) {
    return at::from_blob(const_cast<char*>(s.data()), {static_cast<std::int64_t>(s.size())}, at::kByte)
        .clone()
        .to(device);
  };
  if (group_.rank() != to) {
    if (!mine.empty()) group_.send(bytes_tensor(mine), to);
    return;
  }
  auto whole = whole_optimizer();
  for (int r = 0; r < group_.size(); ++r) {
    const auto size = sizes[static_cast<std::size_t>(r)].item<std::int64_t>();
    if (size == 0) continue;
    std::string bytes = mine;
    if (r != to) {
      auto buffer = at::empty({size}, at::TensorOptions().dtype(at::kByte).device(device));
      group_.recv(buffer, r);
      buffer = buffer.cpu();
      bytes.assign(static_cast<const char*>(buffer.data_ptr()), static_cast<std::size_t>(size));
    }
    const auto params = params_of(r);
    auto part = make_(params);
    torch::serialize::InputArchive archive;
    archive.load_from(bytes.data(), bytes.size());
    part->load(archive);
    move_states(*part, *whole, params);
  }
  gathered_ = std::move(whole);
}

void ShardedOptimizer::release_gathered_state() const { gathered_.reset(); }

void ShardedOptimizer::save(torch::serialize::OutputArchive& archive) const {
  if (!gathered_)
    throw ConfigError(fmt::format("cohort ShardedOptimizer on rank {}: save() writes the whole state, which is "
                                  "spread over the ranks\n  fix: call gather_state({}) on every rank first "
                                  "(Checkpointer::save does)",
                                  group_.rank(), group_.rank()));
  gathered_->save(archive);
}

void ShardedOptimizer::load(torch::serialize::InputArchive& archive) {
  auto whole = whole_optimizer();
  whole->load(archive);
  param_groups()[0].set_options(whole->param_groups()[0].options().clone());
  if (shard_.empty()) return;
  local_ = make_(shard_);
  move_states(*whole, *local_, shard_);
}

void ShardedOptimizer::set_lr(double lr) { param_groups()[0].options().set_lr(lr); }

double ShardedOptimizer::lr() const { return param_groups()[0].options().get_lr(); }

std::int64_t ShardedOptimizer::local_state_bytes() const { return local_ ? optimizer_state_bytes(*local_) : 0; }

}  // namespace cohort::zero
