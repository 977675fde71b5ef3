#pragma once
// The shared record of an elastic rendezvous (torchrun's c10d "dynamic" rendezvous),
// as pure logic: which nodes take part in the current round, who waits for the next,
// when the round completes, and who has stopped sending heartbeats. Agents read the
// record from the store, decide with next_join_action(), apply() the action and
// write the record back with a compare-and-set, so concurrent agents never lose an
// update. No sockets here: every rule is testable in microseconds.
//
// Note [Rendezvous rounds]:
//  - A round gathers at least min_nodes and at most max_nodes participants. It
//    completes at once when max_nodes have joined, or at the "last call" deadline
//    (last_call_timeout after it first had min_nodes) with whoever is there. Ranks are
//    then given by the sorted node names, so every agent computes the same ones.
//  - A node that arrives after completion goes on the wait list. Running agents see
//    nodes_waiting() > 0, stop their workers and leave the round (a membership change,
//    which costs no restart); when the last participant has left, the round number
//    advances and everyone, waiting nodes included, joins the next round.
//  - A node whose heartbeats stop for keep_alive_interval * keep_alive_max_missed is
//    dropped by whoever notices (drop_dead_nodes), so a dead node never blocks a round
//    (Note [Heartbeats without clocks]).
//  - `restarts` counts failure restarts for the whole job, in the shared record, so a
//    node cannot reset it by leaving and joining again (pytorch#147064). One failure
//    makes every node's workers fail (the others as casualties), so a failed round is
//    counted once, by whichever node reports it first (`failed_round`). The limit
//    itself is the job's too (`max_restarts`, fixed by the first agent to join).
//  - A job under --fault-tolerance in-process holds its rounds (`held`, fixed by the
//    first agent like --nnodes): Note [Held rounds].
//  - So is the job's --nnodes MIN:MAX (`min_nodes`, `max_nodes`): agents that disagree
//    on when a round is complete would never settle (one admits a node the other
//    restarts for, round after round), so an agent with another range is refused.
//
// Note [Heartbeats without clocks]
// Hosts' clocks disagree, and a clock can step (NTP, a VM resumed): a heartbeat
// stamped with one host's wall-clock time and aged against another's turns a step
// of 30 s into a "dead" node. So a heartbeat carries no time at all: it is a number
// from the record's own sequence (`beats`), new at every beat and never reused.
// Each observer (HeartbeatWatch) notes on its own monotonic clock when it last saw
// a node's number change, and drops the node once it has not changed for the
// keep-alive bound. No clock is ever compared with another host's, and a step of
// the wall clock changes nothing. Local deadlines (joining) are monotonic too; the
// one wall-clock time left in the record is the last call of a forming round, a
// deadline shared by every node, which a clock step can only move (the round
// closes earlier or later by the step), never turn into a lost node.
//
// Note [Held rounds]
// Under --fault-tolerance in-process the workers mend the world themselves: a dead
// worker is replaced alone and the survivors never stop (launcher/in_process.h). So
// once a held round is complete its shape is the job's for good: `slots` node ranks,
// each with the same workers and global ranks. A node that leaves or stops sending
// heartbeats leaves its slot vacant and the round goes on (the others are not
// stopped; the agent hosting the store publishes its ranks dead: Note [A lost
// slot's ranks are published dead] in launcher/in_process.h). A node that arrives
// while a slot is vacant takes the lowest one (kTakeSlot) and starts its workers as
// new incarnations of that slot's ranks, which take the state from a live peer. With
// no slot vacant it waits, as a spare, for one (bounded by join_timeout). Nothing
// re-forms the world: a held round never grows, and ends only when the job closes
// or every node has left it. Once a node has finished (`done`), no slot is taken.
#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace cohort::elastic {

// Milliseconds: of wall-clock time since the Unix epoch for the shared last-call
// deadline, of an observer's own monotonic clock for everything else.
using Millis = std::chrono::milliseconds;

// What the workers' MASTER_ADDR/MASTER_PORT lead to (Note [The workers' store] in
// launcher/worker_store.h): cohort's authenticated store, or a plain c10d TCPStore
// that stock c10d workers (Python's init_process_group, plain LibTorch) can speak.
enum class WorkerStore { kCohort, kTcpStore };

struct RendezvousSettings {
  RendezvousSettings(int min_nodes, int max_nodes) : min_nodes_(min_nodes), max_nodes_(max_nodes) {}
  TORCH_ARG(int, min_nodes);
  TORCH_ARG(int, max_nodes);
  // torchrun's defaults.
  TORCH_ARG(Millis, join_timeout) = Millis(600'000);
  TORCH_ARG(Millis, last_call_timeout) = Millis(30'000);
  TORCH_ARG(Millis, close_timeout) = Millis(30'000);
  TORCH_ARG(Millis, keep_alive_interval) = Millis(5'000);
  TORCH_ARG(int, keep_alive_max_missed) = 3;
  // --rdzv-conf worker_store=cohort|tcpstore
  TORCH_ARG(WorkerStore, worker_store) = WorkerStore::kCohort;
};

// The shortest --rdzv-conf keep_alive_interval, in seconds (Note [rdzv-conf ranges]).
inline constexpr double kMinKeepAliveInterval = 0.1;

// Reads torchrun's --rdzv-conf ("join_timeout=900,last_call_timeout=10,...", seconds;
// and cohort's worker_store=cohort|tcpstore) into `base`. Throws cohort::ConfigError naming the key for an unknown key, a value
// that is not a number, one that is not positive (c10d took 0 to mean "never"), not
// finite or over a week, or a keep_alive_interval under kMinKeepAliveInterval.
RendezvousSettings parse_rdzv_conf(const std::string& conf, RendezvousSettings base);

// The keys `conf` sets, in order (for the static launcher, which takes only
// worker_store). Throws like parse_rdzv_conf for an item that is not KEY=VALUE.
std::vector<std::string> rdzv_conf_keys(const std::string& conf);
// The KEY=VALUE items of `conf`, in order; throws like rdzv_conf_keys.
std::vector<std::pair<std::string, std::string>> rdzv_conf_items(const std::string& conf);

struct RendezvousState {
  std::int64_t round = 0;
  bool complete = false;
  bool closed = false;  // the job is over: nobody joins any more
  std::optional<Millis> last_call;  // the incomplete round completes at this time
  std::map<std::string, int> participants;  // node -> rank (-1 until complete)
  std::set<std::string> wait_list;  // arrived after completion, for the next round
  // Of participants and waiting nodes: each node's latest beat, a number from `beats`
  // (Note [Heartbeats without clocks]).
  std::map<std::string, std::int64_t> heartbeats;
  std::int64_t beats = 0;  // the last beat number given
  std::int64_t restarts = 0;  // failure restarts of the whole job
  std::int64_t max_restarts = -1;  // the job's --max-restarts, fixed by its first agent (-1: none yet)
  int min_nodes = 0, max_nodes = 0;  // the job's --nnodes, fixed by its first agent (0: none yet)
  std::int64_t failed_round = -1;  // the last round whose failure was counted
  std::set<std::string> done;  // participants whose workers all exited 0 this round
  bool held = false;  // Note [Held rounds]: the job's, fixed by its first agent
  int slots = 0;      // a complete held round's node ranks (vacant ones included)
  // Note [Joins folded by any agent] (dynamic_rendezvous.cpp): the announced joins
  // (tickets 1..joins_folded) already applied to this record.
  std::int64_t joins_folded = 0;

  bool operator==(const RendezvousState& other) const;
};

enum class JoinAction {
  kAddToParticipants,
  kAddToWaitList,
  kTakeSlot,  // Note [Held rounds]: into the lowest vacant slot of a held round
  kMarkComplete,
  kWait,        // nothing to change: wait for the record to change, then ask again
  kFinish,      // the round is complete and this node has its rank
  kRemoveSelf,  // past the join deadline: leave cleanly, then fail with kErrorTimeout
  kErrorTimeout,
  kErrorClosed,
};
const char* to_string(JoinAction action);

// What `node` does next to take part in a round, given the record read at `now`
// (wall-clock time, for the last call). `join_expired`: this node's join_timeout
// has run out, on its own monotonic clock.
JoinAction next_join_action(const RendezvousState& state, const std::string& node, Millis now, bool join_expired,
                            const RendezvousSettings& settings);
// Applies `action` for `node` (the actions that change the record); `now` is
// wall-clock time, for the last call.
void apply(RendezvousState& state, JoinAction action, const std::string& node, Millis now,
           const RendezvousSettings& settings);

// Leaves the round (an agent stopping its workers for a restart or a membership
// change). When the last participant of a complete round leaves, the next round opens.
void leave(RendezvousState& state, const std::string& node, const RendezvousSettings& settings);
// A new beat for `node`, if it takes part (Note [Heartbeats without clocks]).
void heartbeat(RendezvousState& state, const std::string& node);

// One observer's view of the heartbeats (Note [Heartbeats without clocks]): when,
// on its own monotonic clock, it last saw each node's beat change.
class HeartbeatWatch {
 public:
  // Looks at the record at `now` (this observer's monotonic clock).
  //
  // Note [A blind observer]: an observer that could not read the store for a while
  // (the store, or etcd, was out) saw no beat change in that time, and would drop
  // every peer at once when it reads again. So when its last look was more than
  // `blind_after` ago, the time in between counts against nobody: each peer's
  // silence is timed from before the gap (found by review: a 4 s outage of every
  // etcd member dropped a healthy node under a 6 s bound).
  void observe(const RendezvousState& state, Millis now, Millis blind_after = Millis::max());
  // The nodes of the record last observed whose beat has not changed for more than
  // `bound` at `now`.
  std::vector<std::string> silent(Millis now, Millis bound) const;

 private:
  struct Seen {
    std::int64_t beat;
    Millis since;
  };
  std::map<std::string, Seen> seen_;
  std::optional<Millis> last_look_;
};

// An observer whose looks are further apart than this was blind in between (Note
// [A blind observer]): twice the heartbeat interval, since the agents' heartbeat
// threads look once an interval.
Millis blind_after(const RendezvousSettings& settings);

// Observes the record with `watch` at `now` (the observer's monotonic clock), then
// drops the nodes silent for longer than the keep-alive bound; returns them.
std::vector<std::string> drop_dead_nodes(RendezvousState& state, HeartbeatWatch& watch, Millis now,
                                         const RendezvousSettings& settings);
// Nodes waiting for the next round: a running job restarts to take them in.
int nodes_waiting(const RendezvousState& state);

// The job's --max-restarts: the record's, or `mine` (then stored) when the record has
// none yet. An agent started with another value follows the job's, so a node that
// rejoins with a larger one cannot extend the job's budget (pytorch#147064).
std::int64_t adopt_max_restarts(RendezvousState& state, int mine);

// The job's --nnodes as {MIN, MAX}: the record's, or {min_nodes, max_nodes} (then
// stored) when the record has none yet. An agent whose range differs from the
// job's must not take part: the caller refuses it (Note [Rendezvous rounds]).
std::pair<int, int> adopt_nnodes(RendezvousState& state, int min_nodes, int max_nodes);
// Whether the job holds its rounds (Note [Held rounds]): the record's, or `mine`
// when no agent has fixed the job's settings yet (max_nodes still 0; call it before
// adopt_nnodes). An agent that differs is refused by the caller.
bool adopt_held(RendezvousState& state, bool mine);
// Whether a participant holds node rank `slot`.
bool slot_taken(const RendezvousState& state, int slot);
// The lowest slot of a complete held round that no participant holds, or -1.
int vacant_slot(const RendezvousState& state);

// "2" or "1:4", as --nnodes is written.
std::string nnodes_text(int min_nodes, int max_nodes);

// Counts the failure of `round` against the job's limit (`state.max_restarts`, set
// by adopt_max_restarts; none adopted yet allows none), once however many nodes
// report it. Returns false when the restarts are used up: the caller closes the job.
bool count_failure(RendezvousState& state, std::int64_t round);

// Whether a change from `before` to `after` is one that agents waiting in
// next_round() must see at once (Note [Waiting without reading the record]): the
// round, its completion or closing, its last call, the wait list, a vacant slot.
bool waiters_care(const RendezvousState& before, const RendezvousState& after);

// The record as stored (JSON). decode throws cohort::DataError on anything else.
std::string encode(const RendezvousState& state);
RendezvousState decode(const std::string& bytes);

}  // namespace cohort::elastic
