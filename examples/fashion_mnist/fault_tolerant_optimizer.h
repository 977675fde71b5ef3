#pragma once
// How the fault-tolerant loop (fault_tolerant.cpp) holds its model and optimizer:
//   --zero 0   the whole optimizer on every replica, DDP over the quorum;
//   --zero 1   the optimizer's state sharded inside each replica of
//              --shards-per-replica ranks, DDP over the quorum;
//   --zero 2   the gradients sharded too: reduced inside the replica and averaged
//              over the replicas, no DDP
// (cohort::fault_tolerance::ReplicaShardedOptimizer, docs/fault_tolerance.md). Each
// quorum that changed rebuilds DDP and the sharded optimizer over its groups.
#include <torch/optim/optimizer.h>

#include <iosfwd>
#include <memory>
#include <string>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/fault_tolerance/replica_group.h"
#include "cohort/fault_tolerance/replica_sharded_optimizer.h"
#include "model.h"
#include "options.h"

namespace fashion_mnist {

class FaultTolerantOptimizer {
 public:
  FaultTolerantOptimizer(const TrainerOptions& o, FashionNet model);

  // What a live replica sends to a joining one, and what the joiner loads.
  void save_state(std::ostream& out) const;
  void load_state(std::istream& in);

  // When the quorum changed; collective over its groups (inside the step's try).
  void on_quorum(const cohort::fault_tolerance::Quorum& q);
  at::Tensor forward(const at::Tensor& x);
  void zero_grad();
  // After backward, whether or not it succeeded (`ok`): --zero 2 averages over the
  // replicas. Returns false when the step failed here or on a peer.
  bool after_backward(const cohort::fault_tolerance::Quorum& q, bool ok);
  void set_lr(double lr);
  // After the commit. False when this rank discarded its state (Note [A step that
  // is collective after the commit] in replica_sharded_optimizer.h).
  bool step(cohort::fault_tolerance::ReplicaGroup& replicas);

  // Checkpoints: over the quorum (the whole optimizer), or over this rank's replica,
  // of which only the quorum's first replica writes (every replica holds the same).
  std::unique_ptr<cohort::checkpoint::Checkpointer> checkpointer(const std::string& dir, int keep,
                                                                 const cohort::fault_tolerance::Quorum& q) const;
  bool writes_checkpoints(const cohort::fault_tolerance::Quorum& q) const;
  torch::optim::Optimizer& optimizer();

 private:
  FashionNet model_;
  int zero_;
  std::unique_ptr<torch::optim::Optimizer> whole_;                             // --zero 0
  std::unique_ptr<cohort::fault_tolerance::ReplicaShardedOptimizer> sharded_;  // --zero 1, 2
  std::unique_ptr<cohort::ddp::DistributedDataParallel<FashionNet>> ddp_;      // --zero 0, 1
};

}  // namespace fashion_mnist
