#pragma once
// The job's record when it lives in etcd (--rdzv-backend etcd): under c10d the store
// goes with its job, but etcd outlives it, so a record may be a finished job's, a
// killed job's, or this job's. Each function does nothing for a store that is not
// etcd.
#include <functional>
#include <string>

#include "cohort/elastic/dynamic_rendezvous.h"
#include "cohort/launcher/agent_store.h"

namespace cohort::launcher {

// Note [A finished job's keys in etcd]: etcd outlives the job, so the last agent to
// leave a closed job deletes its keys (under "cohort/<run id>/"), and the same
// --rdzv-id can start a new job. An agent that sees others still in the record
// leaves them the duty. Destroy it after the agent's heartbeats have stopped: no
// beat may write the record again.
class ForgetsFinishedJob {
 public:
  ForgetsFinishedJob(elastic::DynamicRendezvous& rdzv, const AgentStore& store) : rdzv_(rdzv), store_(store) {}
  ForgetsFinishedJob(const ForgetsFinishedJob&) = delete;
  ForgetsFinishedJob& operator=(const ForgetsFinishedJob&) = delete;
  // The agent is leaving because etcd stopped answering: reading the record again
  // would only wait out another failover.
  void store_lost() { lost_ = true; }
  ~ForgetsFinishedJob();

 private:
  elastic::DynamicRendezvous& rdzv_;
  const AgentStore& store_;
  bool lost_ = false;
};

// Note [An abandoned record in etcd]: a job killed whole (every agent at once) leaves
// a record that is not closed, and a new job under its id would join it: inherit
// its --nnodes, --max-restarts with the restarts used, --fault-tolerance, and its
// workers' keys (found by review). Before it joins, an agent that finds a record
// nobody is in, or one that no heartbeat changes for a heartbeat bound and one
// interval more, deletes the job's keys, in one transaction that holds only while
// the record is still as it read it, and says so. A live job's record changes at
// every heartbeat, so an agent joining it waits at most one interval here. `check`
// is called between looks (the agent's signals).
void clear_abandoned_record(elastic::DynamicRendezvous& rdzv, const AgentStore& store,
                            const std::function<void()>& check);

// What to add to a refusal that a killed job's record may explain.
std::string stale_record_hint(const AgentStore& store);

// Said when the record is closed before this agent's first round.
std::string closed_record_hint(const AgentStore& store, const std::string& run_id);

}  // namespace cohort::launcher
