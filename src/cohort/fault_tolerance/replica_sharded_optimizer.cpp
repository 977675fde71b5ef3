#include "cohort/fault_tolerance/replica_sharded_optimizer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstring>

#include "cohort/errors.h"
#include "cohort/zero/partition.h"

namespace cohort::fault_tolerance {

ReplicaShardedOptimizer::ReplicaShardedOptimizer(std::vector<at::Tensor> parameters, zero::OptimizerFactory make,
                                                 zero::ShardedOptimizerOptions options)
    : parameters_(std::move(parameters)), make_(std::move(make)), options_(std::move(options)) {}

zero::ShardedOptimizer& ReplicaShardedOptimizer::optimizer() {
  if (!current_)
    throw ConfigError("cohort: fault tolerance: ReplicaShardedOptimizer::optimizer() before on_quorum(); build it "
                      "at the first begin_step() (when the quorum's `changed` is true)");
  return *current_;
}

const zero::ShardedOptimizer& ReplicaShardedOptimizer::optimizer() const {
  return const_cast<ReplicaShardedOptimizer*>(this)->optimizer();
}

// Note [Sharding inside a replica] (quorum.h): each quorum is a new group, so the
// optimizer is built again over it. Its partition depends on the parameters and on
// k alone, so this rank owns the same shard in every quorum, and the state moves
// from the old optimizer (or from a transfer) into the new one as it is.
void ReplicaShardedOptimizer::on_quorum(const Quorum& q) {
  if (!q.shard_group.is_member())
    throw ConfigError("cohort: fault tolerance: ReplicaShardedOptimizer needs replicas of several ranks: make the "
                      "ReplicaGroup with ReplicaGroupOptions().shards_per_replica(k), k > 1 (one rank per replica "
                      "has nothing to shard over; use the optimizer itself)");
  // First, so that a rank whose optimizer fails to build still tells its peers
  // (Note [Telling the other replicas of a failed step]).
  quorum_ = q.id;
  peers_ = q.peer_group;
  replicas_ = q.replicas;
  shard_ = q.shard;
  std::vector<std::int64_t> bytes;
  for (const auto& p : parameters_) bytes.push_back(static_cast<std::int64_t>(p.numel()) * p.element_size());
  const auto owner = zero::partition_by_size(bytes, q.shard_group.size());
  mine_.clear();
  for (std::size_t i = 0; i < parameters_.size(); ++i)
    if (owner[i] == q.shard && parameters_[i].requires_grad()) mine_.push_back(parameters_[i]);
  auto next = std::make_unique<zero::ShardedOptimizer>(parameters_, q.shard_group, make_, options_);
  const auto layout = next->shard_layout();
  if (received_) {
    if (received_->layout.world_size != layout.world_size || received_->layout.owner != layout.owner ||
        received_->shard != q.shard)
      throw DataError(fmt::format("cohort: fault tolerance: the optimizer shard received from a live replica is "
                                  "shard {} of {}, but this rank holds shard {} of {} (or the parameters are cut "
                                  "otherwise)\n  fix: every rank must run the same program, model and "
                                  "shards_per_replica",
                                  received_->shard, received_->layout.world_size, q.shard, layout.world_size));
    next->load_shards(received_->layout, [&](int k) {
      if (k != received_->shard)
        throw DataError(fmt::format("cohort: fault tolerance: shard {} was asked of a transfer that holds shard {}",
                                    k, received_->shard));
      return received_->bytes;
    });
    next->set_lr(received_->lr);
    received_.reset();
  } else if (current_) {
    const auto bytes = current_->shard_bytes();
    next->load_shards(current_->shard_layout(), [&](int) { return bytes; });
    next->set_lr(current_->lr());
  }
  current_ = std::move(next);
}

// Note [ZeRO-2 gradients] (zero/gradient_sharder.h) left the owner with the mean over
// its replica's k ranks; the mean over the replicas of those is the mean over every
// rank. A parameter no rank of any replica used keeps its gradient undefined (one
// more element per parameter carries the votes, as the sharder's do), and the last
// element counts the ranks whose step failed.
bool ReplicaShardedOptimizer::average_over_replicas(const Quorum& q, bool ok) {
  if (!options_.shard_gradients() || q.replicas == 1) return ok;
  last_failure_ = "this rank's step failed";
  if (q.id != quorum_) {
    // on_quorum() failed before it began, or was not called: no peer waits on this rank.
    if (!ok) return false;
    throw ConfigError(fmt::format("cohort: fault tolerance: ReplicaShardedOptimizer::average_over_replicas() in "
                                  "quorum {}, but on_quorum() last ran for quorum {}\n  fix: call on_quorum(q) "
                                  "whenever begin_step()'s quorum has `changed`",
                                  q.id, quorum_));
  }
  at::NoGradGuard no_grad;
  std::int64_t numel = 0;
  for (const auto& p : mine_) numel += p.numel();
  const auto votes = static_cast<std::int64_t>(mine_.size());
  const auto options = mine_.empty() ? parameters_.front().options() : mine_.front().options();
  auto flat = at::zeros({numel + votes + 1}, options);
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < mine_.size() && ok; ++i) {
    const auto& g = mine_[i].grad();
    if (g.defined()) {
      flat.narrow(0, offset, mine_[i].numel()).copy_(g.reshape({-1}));
      flat[numel + static_cast<std::int64_t>(i)] = 1;
    }
    offset += mine_[i].numel();
  }
  if (!ok) flat[numel + votes] = 1;
  try {
    peers_.all_reduce(flat);
  } catch (const CommError& e) {
    last_failure_ = e.what();
    return false;
  } catch (const TimeoutError& e) {
    last_failure_ = e.what();
    return false;
  }
  if (!ok) return false;
  if (flat[numel + votes].item<double>() > 0) {
    last_failure_ = "the step failed on a rank of another replica";
    return false;
  }
  last_failure_.clear();
  offset = 0;
  for (std::size_t i = 0; i < mine_.size(); ++i) {
    auto& p = mine_[i];
    if (flat[numel + static_cast<std::int64_t>(i)].item<double>() > 0) {
      auto mean = flat.narrow(0, offset, p.numel()).view(p.sizes()).div(replicas_);
      if (p.grad().defined())
        p.mutable_grad().copy_(mean);
      else
        p.mutable_grad() = mean.clone();
    }
    offset += p.numel();
  }
  return true;
}

bool ReplicaShardedOptimizer::step(ReplicaGroup& replicas) {
  try {
    optimizer().step();
    return true;
  } catch (const CommError&) {
  } catch (const TimeoutError&) {
  }
  // Note [A step that is collective after the commit]
  replicas.discard_state();
  return false;
}

void ReplicaShardedOptimizer::zero_grad() {
  if (current_) {
    current_->zero_grad();
    return;
  }
  for (auto& p : parameters_)
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
}

void ReplicaShardedOptimizer::save_state(torch::serialize::OutputArchive& archive) const {
  const auto& opt = optimizer();
  const auto layout = opt.shard_layout();
  const auto bytes = opt.shard_bytes();
  auto payload = at::empty({static_cast<std::int64_t>(bytes.size())}, at::kByte);
  if (!bytes.empty()) std::memcpy(payload.data_ptr(), bytes.data(), bytes.size());
  std::vector<std::int64_t> owners(layout.owner.begin(), layout.owner.end());
  archive.write("zero/shards", at::tensor(static_cast<std::int64_t>(layout.world_size)));
  archive.write("zero/owner", at::tensor(owners, at::kLong));
  archive.write("zero/shard", at::tensor(static_cast<std::int64_t>(shard_)));
  archive.write("zero/bytes", payload);
  archive.write("zero/lr", at::tensor(opt.lr(), at::kDouble));
}

void ReplicaShardedOptimizer::load_state(torch::serialize::InputArchive& archive) {
  Received r;
  try {
    at::Tensor shards, owner, shard, bytes, lr;
    archive.read("zero/shards", shards);
    archive.read("zero/owner", owner);
    archive.read("zero/shard", shard);
    archive.read("zero/bytes", bytes);
    archive.read("zero/lr", lr);
    r.layout.world_size = static_cast<int>(shards.item<std::int64_t>());
    auto o = owner.contiguous();
    for (std::int64_t i = 0; i < o.numel(); ++i) r.layout.owner.push_back(static_cast<int>(o[i].item<std::int64_t>()));
    r.shard = static_cast<int>(shard.item<std::int64_t>());
    auto b = bytes.contiguous();
    r.bytes.assign(static_cast<const char*>(b.data_ptr()), static_cast<std::size_t>(b.numel()));
    r.lr = lr.item<double>();
  } catch (const c10::Error& e) {
    throw DataError(fmt::format("cohort: fault tolerance: the training state received holds no optimizer shard "
                                "({})\n  fix: every rank must run the same program with a ReplicaShardedOptimizer",
                                e.what_without_backtrace()));
  }
  received_ = std::move(r);
}

}  // namespace cohort::fault_tolerance
