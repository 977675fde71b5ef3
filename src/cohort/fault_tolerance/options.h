#pragma once
// How a fault-tolerant replica group behaves, in LibTorch's options idiom:
//
//   auto replicas = cohort::fault_tolerance::ReplicaGroup::join(
//       cohort::fault_tolerance::ReplicaGroupOptions().min_replicas(2));
//
// Every wait of the group is bounded by one of these (docs/fault_tolerance.md,
// "Deadlines").
#include <torch/arg.h>

#include <chrono>
#include <functional>
#include <string>

#include "cohort/comm/environment.h"

namespace cohort::fault_tolerance {

struct ReplicaGroupOptions {
  // Below this many live replicas the job stops: every survivor throws a
  // TimeoutError naming the missing replicas once min_replicas_timeout has passed.
  TORCH_ARG(int, min_replicas) = 1;
  // Bound on each collective of a step (and on the live transfer). A replica that
  // stops answering (SIGSTOP, a hung host) is dropped after this; a dead one is
  // dropped at once (its sockets close, and the launcher reports it).
  TORCH_ARG(std::chrono::milliseconds, collective_timeout) = std::chrono::seconds(10);
  // How long a new quorum waits for the previous quorum's members that are not known
  // dead before it forms without them. Also bounds the step's commit vote.
  TORCH_ARG(std::chrono::milliseconds, quorum_timeout) = std::chrono::seconds(5);
  // How long the first quorum waits for every replica to start.
  TORCH_ARG(std::chrono::milliseconds, start_timeout) = std::chrono::minutes(5);
  // How long the group may stay below min_replicas before it gives up.
  TORCH_ARG(std::chrono::milliseconds, min_replicas_timeout) = std::chrono::seconds(60);
  // The c10d backend of each quorum's group: "gloo" (CPU tensors) or "auto".
  TORCH_ARG(std::string, backend) = "gloo";
  // Called on the replica's own thread at each phase of forming a quorum, for logs
  // and for tests that fail a replica at a chosen point: "arrived q<t>", "decided
  // q<t>" (its members are known), "formed q<t>", "sending q<t>", "receiving q<t>",
  // "joined q<t>".
  TORCH_ARG(std::function<void(const std::string&)>, on_event) = nullptr;
  // What every replica must agree on: the settings that shape the run (a replica's
  // share of the batch, the steps, the seed, the optimizer ...), as text. A replica
  // whose text differs from replica 0's (the job's) throws a ConfigError naming both
  // at its first begin_step(), before it joins a quorum (Note [One configuration]).
  TORCH_ARG(std::string, configuration) = "";
  // Ranks that make one replica and shard its optimizer state among themselves
  // (ZeRO-1/2 inside a replica, fault tolerance across replicas; Note [Sharding
  // inside a replica] in quorum.h). Ranks r*k .. r*k+k-1 are replica r. A quorum
  // takes whole replicas only, and min_replicas counts replicas. 1: every rank is
  // a replica of its own.
  TORCH_ARG(int, shards_per_replica) = 1;

 public:
  // Defaults overridden by COHORT_FT_MIN_REPLICAS (set by `cohort run
  // --min-replicas`), COHORT_FT_COLLECTIVE_TIMEOUT, COHORT_FT_QUORUM_TIMEOUT and
  // COHORT_FT_MIN_REPLICAS_TIMEOUT (seconds). Throws ConfigError for bad values.
  static ReplicaGroupOptions from_env(const comm::EnvMap& env);
  void validate() const;
};

}  // namespace cohort::fault_tolerance
