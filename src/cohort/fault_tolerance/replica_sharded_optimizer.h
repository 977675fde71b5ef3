#pragma once
// ZeRO-1/2 inside a fault-tolerant replica: each replica is k ranks that partition
// the optimizer state among themselves, and the fault tolerance is across replicas
// (Note [Sharding inside a replica] in quorum.h; HSDP's layout with ZeRO's state).
//
//   auto replicas = ft::ReplicaGroup::join(ft::ReplicaGroupOptions::from_env(env).shards_per_replica(2));
//   ft::ReplicaShardedOptimizer zero(net->parameters(), make_adam,
//                                    cohort::zero::ShardedOptimizerOptions().shard_gradients(stage == 2));
//   replicas.on_transfer([&](std::ostream& o) { ft::save_training_state(o, *net, zero); },
//                        [&](std::istream& i) { ft::load_training_state(i, *net, zero); });
//   while (replicas.step() < steps) {
//     const auto& q = replicas.begin_step();
//     bool ok = true;
//     try {
//       if (q.changed) {
//         zero.on_quorum(q);                          // over this replica's k ranks
//         if (stage == 1) ddp.emplace(net, q.group);  // ZeRO-1: DDP averages over every rank
//       }
//       zero.zero_grad();
//       loss_of(batch).backward();
//     } catch (const cohort::CommError&) { ok = false; } catch (const cohort::TimeoutError&) { ok = false; }
//     ok = zero.average_over_replicas(q, ok);          // ZeRO-2: this shard over the replicas
//     if (replicas.end_step(ok)) zero.step(replicas);
//   }
//
// Note [A step that is collective after the commit]
// A plain optimizer's step() is local, so once end_step() commits, nothing can fail.
// ZeRO's step() is not: each owner steps its shard and broadcasts the updated
// parameters to the other ranks of its replica. If a rank of the replica dies or
// stops during that broadcast, the others are left with some parameters at step s+1
// and some at s, though their step count says s+1, and they must never serve as a
// transfer's source. So step() catches that failure and calls
// ReplicaGroup::discard_state(): the rank joins the next quorum as a replica with no
// state, and takes the model and its shard from a live rank of the same shard in
// another replica. Only the replica that lost a rank is affected: the broadcast runs
// inside one replica, so every other replica completes it. A rank whose broadcast
// completed holds a whole model at s+1 (each parameter it did not step arrived from
// its owner), whatever happened to the others.
//
// Note [Telling the other replicas of a failed step]
// Under ZeRO-2 a step's collectives are two levels deep: the reduce of each gradient
// to its owner inside the replica, then the all-reduce of each shard over the
// replicas. When a rank dies, only its direct peers fail at once: its replica's
// reduce, and its own shard's all-reduce. The other shards' all-reduce waits for
// the dead rank's replica-mates, which abandoned the step when their reduce failed,
// and would hold the other replica until collective_timeout (10 s where a death
// otherwise costs milliseconds; found by the trainer's kill -9 test). So every rank
// takes part in its shard's all-reduce whether or not its step failed, with one more
// element that counts the failures: a peer learns of the failure from the sum, at
// once, and the step aborts everywhere.
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/checkpoint/sharded_state.h"
#include "cohort/fault_tolerance/replica_group.h"
#include "cohort/zero/sharded_optimizer.h"

namespace cohort::fault_tolerance {

class ReplicaShardedOptimizer {
 public:
  ReplicaShardedOptimizer(std::vector<at::Tensor> parameters, zero::OptimizerFactory make,
                          zero::ShardedOptimizerOptions options = zero::ShardedOptimizerOptions());

  // Collective over q.shard_group: builds the ShardedOptimizer over it, with the state
  // this rank held (or received from a live replica since). Call whenever q.changed,
  // inside the step's try: a rank that dies here fails the step like any collective.
  // Throws ConfigError when the replica group was not made with shards_per_replica > 1.
  void on_quorum(const Quorum& q);
  // ZeRO-2 (shard_gradients): sums this rank's shard of the gradients over
  // q.peer_group and divides by the replicas, so that it is the mean over every rank
  // of the quorum. Collective, after backward, and called whether or not this rank's
  // step succeeded so far (`ok`; Note [Telling the other replicas of a failed
  // step]). Returns false when this rank or a peer failed, or the all-reduce did.
  // ZeRO-1 (DDP over q.group already averaged every gradient): returns `ok`.
  bool average_over_replicas(const Quorum& q, bool ok);
  // Why the last average_over_replicas() returned false, for logs: the all-reduce's
  // own error, or that a peer's step failed.
  const std::string& last_failure() const { return last_failure_; }
  // After end_step() returned true: steps this rank's shard and broadcasts it inside
  // the replica. Returns false, having told `replicas` to discard this rank's state,
  // when that broadcast failed (Note [A step that is collective after the commit]).
  bool step(ReplicaGroup& replicas);
  void zero_grad();

  // Throws ConfigError before the first on_quorum(). Its learning rate (set_lr) is
  // kept across the rebuilds, and travels with a transfer.
  zero::ShardedOptimizer& optimizer();
  const zero::ShardedOptimizer& optimizer() const;

  // This rank's shard, for a live transfer (training_state.h).
  void save_state(torch::serialize::OutputArchive& archive) const;
  // Kept until the next on_quorum(), which builds the optimizer with it. Throws
  // DataError when the archive holds no shard, or one cut another way.
  void load_state(torch::serialize::InputArchive& archive);

 private:
  struct Received {
    checkpoint::ShardLayout layout;
    int shard = 0;
    std::string bytes;
    double lr = 0;
  };
  std::vector<at::Tensor> parameters_;
  zero::OptimizerFactory make_;
  zero::ShardedOptimizerOptions options_;
  std::unique_ptr<zero::ShardedOptimizer> current_;
  comm::Group peers_;
  std::int64_t quorum_ = -1;  // the quorum on_quorum() last ran for
  int replicas_ = 1;
  int shard_ = 0;
  std::vector<at::Tensor> mine_;  // this rank's shard of parameters_, requiring grad
  std::string last_failure_;
  std::optional<Received> received_;
};

}  // namespace cohort::fault_tolerance
