#pragma once
// Which replicas train together: a quorum, decided through the job's store by the
// replicas themselves (no extra server), and numbered 1, 2, ... for the whole job.
//
// Note [How a quorum forms]
// Each replica that wants to train in quorum t writes q<t>/arrived/<id> and waits.
// Any arrival may decide: once every member of quorum t-1 that is not known dead
// (cohort/ft/dead/<id>, written by the launcher when it sees a worker exit) has
// arrived, or once quorum_timeout has passed since this replica arrived, it proposes
// the replicas that have arrived, with compareSet on q<t>/members. The first
// proposal wins and every arrival reads it back, so all agree. A replica that
// arrives after the decision is not in it: it joins a later quorum (a replica that
// was stopped and resumes, or a replacement slower than the survivors). A replica
// waits only for members it has reason to expect: joiners that have arrived are
// taken, and those still starting are not waited for (they ask for the next
// quorum through join_requests; Note [Joining at a step boundary] in
// replica_group.cpp).
//
// Note [Who may decide]
// Only a member of quorum t-1 may decide quorum t (for t = 1: every first
// incarnation). A joiner, or a replica that was stopped and dropped, waits for the
// live members to come to it at their next step boundary: otherwise, once its own
// deadline passed, it would form a quorum of itself and train alone on stale state.
// When every member of quorum t-1 is known dead, the joiners may decide (the whole
// job was lost; the quorum starts from the replicas' own state, e.g. a checkpoint).
//
// Note [Sharding inside a replica]
// With ReplicaGroupOptions::shards_per_replica k > 1, a replica is k ranks (r*k ..
// r*k+k-1) that partition the optimizer state among themselves (ZeRO-1/2), and the
// fault tolerance is across replicas, as in HSDP. Each rank still arrives and votes
// on its own, but the proposal takes only whole replicas: a rank whose replica has
// a rank missing (dead, stopped, or a replacement not yet arrived) is left out, as a
// late arrival is, and asks in again (Note [Joining at a step boundary] in
// replica_group.cpp) until its replica is whole. Rank j of one replica holds the
// same shard as rank j of every other, so a lost rank's shard lives on in the other
// replicas, and a joiner takes its shard from a live rank of the same index (Note
// [Live transfer]). min_replicas counts whole replicas. A proposal never leaves out
// the newest state: while a rank that arrived holds a later step than every whole
// replica, the quorum waits for that rank's replica to be whole. Otherwise two ranks
// with no state (a replacement, and its replica's survivor whose state was
// discarded) could form a quorum alone while the replica that trained on is missing
// a rank for a moment, and start again from nothing (found by the kill -9 tests).
// When the newest state of a shard was lost with every rank that held it (the same
// shard lost in every replica before any was whole again), no quorum can go on from
// it: the members stop with an error, and the job resumes from its checkpoint.
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cohort/compat/c10d.h"
#include "cohort/errors.h"

namespace cohort::fault_tolerance {

// Thrown to a replica that wants to join after the live replicas called
// ReplicaGroup::finish(): there is nothing left to train; exit normally.
class TrainingFinished : public Error {
 public:
  TrainingFinished(const std::string& message, std::int64_t step) : Error(message), step_(step) {}
  std::int64_t step() const noexcept { return step_; }

 private:
  std::int64_t step_;
};

struct Member {
  int id = 0;           // the replica's launcher rank
  int incarnation = 0;  // 0 for its first process, k for its k-th replacement
  std::int64_t step = 0;  // steps this replica has committed; -1: has no state yet
};

struct QuorumRecord {
  std::int64_t id = 0;
  std::vector<Member> members;  // sorted by id
  std::int64_t join_requests = 0;  // the join_requests counter when it was decided

  int index_of(int replica_id) const;  // -1 when not a member
  std::int64_t max_step() const;
  // Note [Sharding inside a replica]: the index of the lowest-id member of `shard`
  // (its id modulo `shards`) at max_step(), or -1; and a shard of a member that has
  // no such source, or -1. Nobody has state to give at a max_step() below 0.
  int source_of(int shard, int shards) const;
  int shard_without_source(int shards) const;
  std::string describe() const;  // "quorum 3: replicas 0, 2 (step 41)"
  std::string encode() const;
  static QuorumRecord decode(std::int64_t id, const std::string& text);
};

// Every key of the protocol, under the job's store (docs/fault_tolerance.md).
namespace keys {
std::string quorum(std::int64_t id);  // "cohort/ft/q<id>"
std::string members(std::int64_t id);
std::string arrived(std::int64_t id, int replica);
std::string arrivals(std::int64_t id, int bucket);  // Note [Arrivals in buckets]
std::string dead(int replica);
std::string latest();
std::string finished();
std::string configuration();
std::string join_requests();
std::string events();
std::string event(std::int64_t n);
}  // namespace keys

struct FormRules {
  int max_replicas = 1;  // replica ids are 0..max_replicas-1
  int min_replicas = 1;  // whole replicas (Note [Sharding inside a replica])
  int shards_per_replica = 1;
  std::chrono::milliseconds wait_for_expected{5000};  // then form without the missing
  std::chrono::milliseconds below_minimum{60000};     // then give up
};

// Note [Arrivals in buckets] (quorum.cpp): replicas kArrivalsPerBucket * b ..
// kArrivalsPerBucket * (b + 1) - 1 append their arrival at a quorum to one key.
inline constexpr int kArrivalsPerBucket = 32;

// Writes `me`'s arrival at quorum `target` (what form_quorum does first).
void announce_arrival(c10d::Store& store, std::int64_t target, const Member& me);

// The incarnation the launcher reported dead for `replica`, or -1.
int dead_incarnation(c10d::Store& store, int replica);

// Arrives at quorum `target` as `me`, and returns it once decided (by this replica
// or another; Note [How a quorum forms]). The result may not include `me`. Throws
// TimeoutError naming the missing replicas when fewer than min_replicas arrived
// within wait_for_expected + below_minimum, TrainingFinished once keys::finished()
// exists.
// `arrived` (may be null) runs once this replica's arrival is written.
QuorumRecord form_quorum(c10d::Store& store, std::int64_t target, const Member& me, const FormRules& rules,
                         const std::function<void()>& arrived = nullptr);

// The first quorum id not yet decided at or after `from` (the hint in keys::latest()).
std::int64_t next_undecided(c10d::Store& store, std::int64_t from);

}  // namespace cohort::fault_tolerance
