#pragma once
// How an elastic agent's round ends (Note [Elastic agent loop]): telling a failure
// from a lost node, the exit barrier when every worker succeeded, and reporting a
// closed job. The agent hosting the store keeps it up until the others have read
// the outcome.
#include <functional>
#include <string>

#include "cohort/elastic/dynamic_rendezvous.h"

namespace cohort::launcher {

enum class Verdict { kFailure, kMembership, kClosed };

// What this agent is to the job's store: the agent that hosts it (it closes the job
// once every node is done, and keeps the store up until the others have read that),
// a client of it, or an agent of a job kept in etcd (--rdzv-backend etcd), which
// closes the job like a host but keeps nothing up: etcd outlives every agent.
enum class StoreRole { kHost, kClient, kReplicated };

// Whether round `r`, in which this node's workers failed (`own`: on their own
// account, not as a peer's casualty), failed or lost a node. Bounded by the
// heartbeat bound; `check` is called between looks and may throw.
Verdict classify(elastic::DynamicRendezvous& rdzv, const elastic::Round& r, bool own,
                 const std::function<void()>& check);

// Every worker here exited 0: the exit barrier (Note [Exit barrier]), then
// (kHost, kReplicated) the job's close. Returns the agent's exit code.
int finish(elastic::DynamicRendezvous& rdzv, const elastic::Round& r, StoreRole role,
           const std::function<void()>& check);

// Why the job must close rather than restart, read from the record `s` in round
// `r`: some node has finished (Note [Failures after a node finished]), and this
// node's workers failed (`failed_here`) or another node vanished. Empty otherwise.
std::string reason_to_close_after_finish(const elastic::RendezvousState& s, const elastic::Round& r,
                                         bool failed_here);

// The job is closed: prints its root cause, if it failed, and returns the exit code.
// The agent hosting the store then keeps it up for the others (at most
// close_timeout), calling `check` between looks; it may throw (the agent's signals:
// Ctrl-C ends the wait at once).
int report_closed(elastic::DynamicRendezvous& rdzv, StoreRole role, const std::function<void()>& check);

}  // namespace cohort::launcher
