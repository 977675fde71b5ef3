#pragma once
// The elastic rendezvous over a store: the record of rendezvous_state.h kept under
// one key and changed only by compare-and-set, so agents on any number of hosts
// agree on rounds, ranks, heartbeats and the job's restart count. Used by the
// elastic agent (launcher/elastic_agent.h); tests drive several of these on threads.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cohort/elastic/rendezvous_state.h"
#include "cohort/errors.h"

namespace cohort::elastic {

// The job is over (it completed, or it failed for good); joining is refused.
class RendezvousClosedError : public Error {
 public:
  using Error::Error;
};

struct Round {
  std::int64_t round = 0;
  int rank = 0;        // this node's group rank
  int world_size = 1;  // nodes in the round (a held round's slots: Note [Held rounds])
  std::vector<std::string> nodes;  // in rank order ("" for a vacant slot)
  bool held = false;  // Note [Held rounds]
  std::int64_t restarts = 0;  // failure restarts of the job so far
};

// Wall-clock time as the record keeps it (the last call), and this process's
// monotonic clock, for everything local (Note [Heartbeats without clocks]).
Millis wall_now();
Millis steady_now();

class DynamicRendezvous {
 public:
  // `node` names this agent uniquely (host, pid and a random part); `run_id`
  // namespaces every key, so two jobs can share a store.
  DynamicRendezvous(c10::intrusive_ptr<c10d::Store> store, std::string run_id, std::string node,
                    RendezvousSettings settings);

  // Joins the next round and waits until it completes (bounded by join_timeout).
  // `poll` is called between looks at the record (every ~50 ms); it may throw to
  // abandon the join (the agent's signal handling). Throws TimeoutError naming how
  // many nodes came, or RendezvousClosedError.
  Round next_round(const std::function<void()>& poll = nullptr);

  // Leaves the current round (or the wait list). Safe to call when not in one.
  void leave();
  // Refreshes this node's heartbeat and drops nodes whose heartbeats stopped;
  // returns the dropped ones. Silence is timed by this object's own watch, which
  // looks at every record it reads.
  std::vector<std::string> keep_alive();

  RendezvousState read();
  // Applies `change` to the record with compare-and-set, retrying on conflicts.
  // `change` returns false to leave the record as it is. Returns the record as
  // written (or as read, when unchanged).
  RendezvousState update(const std::function<bool(RendezvousState&)>& change);

  // Keys beside the record, for the agents' own exchanges in a round.
  std::string key(const std::string& name) const;
  c10d::Store& store() { return *store_; }
  const std::string& node() const { return node_; }
  const RendezvousSettings& settings() const { return settings_; }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  std::string node_;
  RendezvousSettings settings_;
  HeartbeatWatch watch_;
};

}  // namespace cohort::elastic
