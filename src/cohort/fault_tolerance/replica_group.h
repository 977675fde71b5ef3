#pragma once
// A fault-tolerant replica group for data parallelism: the replicas that are alive
// train together, a lost replica costs the step in flight (redone by the others at
// once), and a replica that (re)joins takes the current state from a live peer over
// the network. The processes of the survivors never restart.
//
//   auto replicas = cohort::fault_tolerance::ReplicaGroup::join();   // under cohort run
//   replicas.on_transfer(save_state, load_state);                     // model, optimizer, ...
//   std::optional<cohort::ddp::DistributedDataParallel<Net>> ddp;
//   while (replicas.step() < steps) {         // a late replacement: TrainingFinished
//     const auto& q = replicas.begin_step();       // a new quorum when replicas changed
//     if (q.changed) ddp.emplace(net, q.group);    // DDP over the live replicas
//     bool ok = true;
//     try {
//       auto batch = data(sampler.indices(replicas.step(), q.rank, q.size));
//       auto loss = loss_of(*ddp, batch) * sampler.loss_weight(replicas.step(), q.rank, q.size);
//       optimizer.zero_grad();
//       loss.backward();                            // gradients averaged over the quorum
//     } catch (const cohort::CommError&) { ok = false; }  // a peer died
//       catch (const cohort::TimeoutError&) { ok = false; }
//     if (replicas.end_step(ok)) optimizer.step();  // every survivor, or none
//   }
//   replicas.finish();
//
// Start it with `cohort run --fault-tolerance in-process` (docs/fault_tolerance.md):
// the launcher restarts only a dead worker and tells the survivors at once.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cohort/comm/world.h"
#include "cohort/fault_tolerance/options.h"
#include "cohort/fault_tolerance/quorum.h"

namespace cohort::fault_tolerance {

struct Quorum {
  std::int64_t id = 0;
  std::vector<Member> members;
  int rank = 0;  // this replica's rank in `group`
  int size = 1;
  comm::Group group;  // the live replicas; valid until the next begin_step
  bool changed = true;  // a new group since the last begin_step: rebuild what holds it
  // No member had trained a step: the job's start, or every replica was lost. The
  // time to load a checkpoint from disk (then resume_at() its step).
  bool fresh_start = false;
  // With ReplicaGroupOptions::shards_per_replica k > 1 (Note [Sharding inside a
  // replica] in quorum.h): `members` are whole replicas, k ranks each, and
  //   shard_group: this replica's k ranks, in shard order; shard the optimizer over it
  //                (zero::ShardedOptimizer, rebound when `changed`);
  //   peer_group:  the rank of this shard in every live replica; ZeRO-2 averages this
  //                shard's gradients over it (sharded_replicas.h).
  // With k = 1, shard_group is a non-member handle and peer_group is `group`.
  comm::Group shard_group;
  comm::Group peer_group;
  int shard = 0;     // this rank's shard: its rank in shard_group
  int replicas = 1;  // whole replicas in the quorum: size / k
  std::vector<int> replica_ids() const;
};

// What happened so far, for logs and benchmarks.
struct ReplicaGroupStats {
  std::int64_t quorums = 0;          // quorums this replica trained in
  std::int64_t aborted_steps = 0;    // steps redone
  std::int64_t transfers_sent = 0;
  std::int64_t transfers_received = 0;
  double last_regroup_seconds = 0;   // the last begin_step that formed a quorum
  // Abandoned groups still held, waiting out collective_timeout (Note [Abandoned
  // groups]): a few after a burst of regroups, none once it has passed.
  std::int64_t groups_held = 0;
};

struct WatchState;

class ReplicaGroup {
 public:
  // The replica of this process, from `cohort run --fault-tolerance in-process`'s
  // environment (RANK is the replica id, WORLD_SIZE the most replicas,
  // COHORT_FT_INCARNATION). Throws ConfigError when not started that way.
  static ReplicaGroup join(ReplicaGroupOptions options = ReplicaGroupOptions::from_env(comm::process_environment()));
  // Over stores you provide: `watch_store` is a second connection to the same store
  // (a blocked wait there must not hold up `store`); tests pass one HashStore twice.
  ReplicaGroup(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Store> watch_store, int replica_id,
               int max_replicas, int incarnation, ReplicaGroupOptions options = ReplicaGroupOptions());
  ~ReplicaGroup();
  ReplicaGroup(ReplicaGroup&&) noexcept;
  ReplicaGroup& operator=(ReplicaGroup&&) = delete;

  // What a live replica sends to one that joins (Note [Live transfer]): `save`
  // writes this replica's training state (model, optimizer, RNG, anything the
  // step count does not give), `load` replaces it. Without them, a joiner
  // starts from its own state, which is only right if it is still identical.
  void on_transfer(std::function<void(std::ostream&)> save, std::function<void(std::istream&)> load);

  // Begins step step(): when replicas died, joined or a step was aborted, forms a
  // new quorum and its group, and brings joiners up to date. Bounded by the
  // options' deadlines; throws TimeoutError when fewer than min_replicas remain,
  // TrainingFinished (quorum.h) when the others have finished.
  const Quorum& begin_step();
  // Ends the step. `ok`: this replica's collectives succeeded. Returns true when
  // every member of the quorum succeeded: apply the step (optimizer.step()), and
  // step() advances. False: the step was aborted everywhere; apply nothing and
  // run step() again (begin_step forms the new quorum).
  bool end_step(bool ok);

  // Call once after the last step, on every replica: a replacement that comes
  // later then gets TrainingFinished from begin_step() instead of waiting for a
  // quorum that will never form.
  void finish();
  // After a begin_step() whose quorum is fresh_start, on every member alike: the
  // state was loaded from a checkpoint of step `step`, so training goes on from
  // there (the sampler's position is the step). Throws ConfigError otherwise.
  void resume_at(std::int64_t step);

  // This rank's state can no longer be trusted (a collective after the commit failed
  // halfway: Note [A step that is collective after the commit] in
  // replica_sharded_optimizer.h). It joins the next quorum as a replica with no
  // state and receives a live replica's, as a replacement does.
  void discard_state();

  std::int64_t step() const { return step_; }
  int replica_id() const { return id_; }
  int max_replicas() const { return max_replicas_; }
  int incarnation() const { return incarnation_; }
  const ReplicaGroupStats& stats() const { return stats_; }
  const ReplicaGroupOptions& options() const { return options_; }

 private:
  enum class Outcome { kIn, kOut, kFailed };
  void regroup();
  Outcome try_quorum(std::int64_t target);
  std::string step_vote() const;
  void forget_committed_vote(const std::string& name);
  void check_configuration();
  void build_subgroups(Quorum& q);
  void set_watched(std::vector<std::string> votes, const std::vector<Member>& members);

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Store> watch_store_;
  int id_;
  int max_replicas_;
  int incarnation_;
  ReplicaGroupOptions options_;
  bool fresh_;  // a replacement with no state of its own yet
  std::int64_t step_ = 0;
  std::string committed_vote_;  // the last committed step's vote (Note [Forgetting committed votes])
  std::int64_t committed_quorum_ = 0;  // ...and its quorum
  std::optional<Quorum> quorum_;
  std::optional<comm::World> world_;
  std::vector<comm::Group> subgroups_;  // the quorum's shard and peer groups, held with world_
  struct Abandoned {
    comm::World world;
    std::vector<comm::Group> subgroups;
    std::chrono::steady_clock::time_point since;
  };
  void abandon_group();
  void release_settled_groups();
  std::deque<Abandoned> abandoned_;  // Note [Abandoned groups]
  std::int64_t join_requests_seen_ = 0;
  bool need_regroup_ = true;
  std::function<void(std::ostream&)> save_;
  std::function<void(std::istream&)> load_;
  ReplicaGroupStats stats_;

  std::unique_ptr<WatchState> watch_;  // Note [Hearing of a death]
};

}  // namespace cohort::fault_tolerance
