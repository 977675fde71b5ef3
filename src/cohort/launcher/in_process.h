#pragma once
// `cohort run --fault-tolerance in-process`, the launcher's part: when a worker
// dies, the agent tells the survivors through the job's store, says so on stderr,
// and starts a replacement of that worker alone while --max-restarts lasts. The
// survivors are never stopped on its account; the workers' library
// (src/cohort/fault_tolerance/) reads the keys below and carries on in-process.
//
// Note [In-process fault tolerance: the keys]
// Under the workers' own store prefix (what a worker's
// PrefixStore(COHORT_STORE_PREFIX, client) sees; "/worker/attempt_0" under
// worker_store=tcpstore), at once when worker RANK's incarnation K exits with a
// non-zero code or by a signal, in this order:
//   set  cohort/ft/dead/<RANK>  = "<K>"               (decimal text)
//   n  = add(cohort/ft/events, 1)
//   set  cohort/ft/event/<n>    = "dead <RANK> <K>"
// and only then the replacement (incarnation K+1) starts, so that it, and anyone
// who sees it, finds the death already published. Events are numbered from 1 in the
// order the agent saw the deaths. The agent writes through a client of its own
// (StaticRendezvous::workers_view), each operation bounded by 10 s; a store that
// fails is reported on stderr and the replacement still starts.
//
// Note [A node started again]
// With several static nodes, a node's agent may vanish with its workers (the
// machine died) and be started again with the same --node-rank while the others
// train on. Its workers are new incarnations of their ranks, and must not share a
// number with an earlier one, whose death may be published under it (a survivor
// would take the newcomer for dead). So each agent start of node N counts itself
// in the store, n = add(cohort/ft/node_starts/<N>, 1), and its first workers are
// incarnation (n - 1) * (--max-restarts + 1): above every number the earlier
// agent could have given, since each replacement spends one of --max-restarts.
//
// Note [A replacement is its rank]
// A replacement gets exactly the environment of its rank's first process (RANK,
// LOCAL_RANK, MASTER_PORT, COHORT_STORE_PREFIX, the token, TORCHELASTIC_RESTART_COUNT
// ...) but for COHORT_FT_INCARNATION, and a log folder of its own
// (attempt_0/<local_rank>_<K>), so that its error file never hides the one of the
// incarnation that died and the root-cause report stays right.
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cohort/compat/c10d.h"
#include "cohort/launcher/failure.h"

namespace cohort::launcher {

// What the worker group does about a worker that died.
enum class FailureAction {
  kStopAll,  // the default: stop every worker (the job restarts or fails)
  kReplace,  // start a replacement of this worker alone
  kLeave,    // leave its slot empty; the others go on
};

// The keys of Note [In-process fault tolerance: the keys].
std::string ft_dead_key(int rank);
inline constexpr const char* kFtEventsKey = "cohort/ft/events";
std::string ft_event_key(std::int64_t n);
std::string ft_node_starts_key(int node_rank);  // Note [A node started again]
// Written by the workers' ReplicaGroup::finish(): the step at which training ended.
inline constexpr const char* kFtFinishedKey = "cohort/ft/finished";

// Publishes the death of `rank`'s incarnation `incarnation` on `store` (the
// workers' prefix); returns the event's number.
std::int64_t publish_death(c10d::Store& store, int rank, int incarnation);

// "exited with code 3", "was killed by SIGKILL".
std::string describe_death(int wait_status);

// The launcher's line about a dead worker. `restart` is the restart about to happen
// (1-based), or 0 when the budget is spent and the worker is not replaced.
std::string death_line(int rank, int incarnation, pid_t pid, int wait_status, int restart, int max_restarts);

// The note printed once when a worker has stayed stopped (SIGSTOP) past
// --frozen-timeout, which in-process mode does not kill.
std::string frozen_note(int rank, int incarnation, pid_t pid, double frozen_timeout);

// Note [A lost slot's ranks are published dead]
// Under the elastic rendezvous (Note [Held rounds] in elastic/rendezvous_state.h) a
// node whose heartbeats stop leaves its slot vacant, and its workers' deaths were
// never published: its agent went with them. The survivors would learn of them only
// at their deadlines, and before the first quorum that is start_timeout (minutes:
// found by review). So the agent hosting the store, which outlives every other,
// publishes them as soon as it sees the slot vacant: each rank of the slot dead up
// to incarnation n * (--max-restarts + 1) - 1, with n the slot's starts so far
// (Note [A node started again]), i.e. every incarnation the lost agent could have
// given. A slot whose agent was lost before it counted its start is counted for it,
// so the next agent's workers (incarnation n * (--max-restarts + 1)) are above the
// published number. Once per vacancy; a slot taken and lost again is published again.
// The slot's starts are read before the record is looked at again: a newcomer takes
// the slot in the record first and counts its start after, so either the second look
// sees it (nothing is published) or its count comes after the one read, and its
// workers are above the published number (found by review, as a race in theory).

// Note [A restart that cannot help]
// A replacement gets exactly its rank's environment (Note [A replacement is its
// rank]), so a worker that stopped on a cohort::ConfigError (its error file says so:
// cohort::elastic::record) would stop on it again: replicas started with settings
// that differ from replica 0's, ranks that do not divide into replicas, a bad flag.
// Such a worker is not replaced and costs no restart; the others go on, and a job
// that cannot train without it ends with that error instead of spending
// --max-restarts on it. Failures of the job itself (a quorum that cannot form, a
// lost shard) are replaced as before: every rank started afresh is how a job whose
// replicas were all lost goes back to its checkpoint on disk.
bool repeats_in_a_replacement(const WorkerOutcome& outcome);

// Note [A stopped worker after the end]
// A worker stopped (SIGSTOP, a hung host) is left alone in in-process mode (Note
// [Frozen workers] in worker_group.cpp): the others drop it and take it back when it
// resumes. Once training has finished without it, nothing is left to take it back
// into, and `cohort run` waited for it forever after the others had written the
// final weights and exited 0 (found by review). So a worker that has been stopped
// for --frozen-timeout after the workers published the end of training
// (kFtFinishedKey) is killed, said so, not replaced, and counted as done: the job's
// result stands. The store is read only for a worker already stopped that long.
std::string stopped_after_the_end_line(int rank, int incarnation, pid_t pid, double frozen_timeout,
                                       std::int64_t finished_at);

// The agent's side of in-process mode: --max-restarts single-worker restarts over
// the whole job. Runs on the agent's main thread only.
class InProcessRestarts {
 public:
  // `workers_store`: a client of the job's store under the workers' prefix.
  InProcessRestarts(c10::intrusive_ptr<c10d::Store> workers_store, int max_restarts);

  // Worker `outcome` (incarnation `incarnation`) died: publishes it, prints the line
  // and says whether to replace it. A store that fails is reported and does not stop
  // the replacement: the survivors still see the replacement join.
  FailureAction on_death(const WorkerOutcome& outcome, int incarnation);

  // Counts this agent's start of node `node_rank` in the store and returns the
  // incarnation of its first workers (Note [A node started again]). A store that
  // fails is an error: the workers could not be told apart from earlier ones.
  int first_incarnation(int node_rank);

  // Note [A lost slot's ranks are published dead]: publishes the deaths of ranks
  // first_rank .. first_rank + count - 1, the workers of node slot `slot`, up to the
  // last incarnation its agents so far could have given, unless `still_vacant`,
  // asked once the slot's starts are read, says a newcomer has taken the slot.
  // Returns whether it published.
  bool publish_lost_slot(int slot, int first_rank, int count, const std::function<bool()>& still_vacant);

  // "cohort run: fault tolerance in-process: N worker(s) not replaced or failed in
  // their last incarnation, ...", for a group whose workers have all exited.
  std::string summary(const std::vector<WorkerOutcome>& in_exit_order) const;

  // The step at which the workers said training finished; nullopt before that, or
  // when the store does not answer (Note [A stopped worker after the end]).
  std::optional<std::int64_t> finished_at() const;

  int restarts_used() const { return used_; }
  int not_replaced() const { return not_replaced_; }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  int max_restarts_;
  int used_ = 0;
  int not_replaced_ = 0;
};

// Note [A lost static node's ranks are published dead]
// Under the static rendezvous no agent heard of another's loss: a node lost before
// the first quorum (its agent and workers gone together) held the others for the
// first quorum's start_timeout, 5 minutes (found by review), and a node lost later
// was dropped only at the survivors' deadlines. So with several static nodes every
// agent beats in the store (an add to cohort/ft/node_beat/<node> every kBeatEvery),
// and node 0's agent, which hosts the store and outlives the others (Note [Static
// exit barrier]), publishes the ranks of a node whose beat has not moved for
// lost_after as dead, exactly as for a vacant elastic slot (Note [A lost slot's
// ranks are published dead]): the first quorum then forms without them at once. An
// agent whose workers are all done says so (cohort/ft/node_done/<node>) and is not
// watched after. A node started again beats again and is watched afresh.
class StaticNodeBeats {
 public:
  // `workers_store`: under the workers' prefix; `node_sizes`: every node's worker
  // count, in node order (ranks follow it).
  StaticNodeBeats(c10::intrusive_ptr<c10d::Store> workers_store, std::vector<int> node_sizes, int node_rank,
                  std::chrono::milliseconds lost_after);
  // Every agent, each monitor tick: beats (at most every kBeatEvery); node 0 also
  // looks at the others' beats and publishes a silent node's ranks through `restarts`.
  void tick(InProcessRestarts& restarts);
  // This node's workers have all exited: it is no longer watched.
  void done();
  static constexpr std::chrono::milliseconds kBeatEvery{500};

 private:
  struct Seen {
    std::int64_t beat = -1;
    std::chrono::steady_clock::time_point since;
    bool published = false;
  };
  c10::intrusive_ptr<c10d::Store> store_;
  std::vector<int> sizes_;
  int node_;
  std::chrono::milliseconds lost_after_;
  std::chrono::steady_clock::time_point last_beat_{};
  std::vector<Seen> seen_;
  bool warned_ = false;
};

}  // namespace cohort::launcher
