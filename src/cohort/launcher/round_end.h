#pragma once
// How an elastic agent's round ends (Note [Elastic agent loop]): telling a failure
// from a lost node, the exit barrier when every worker succeeded, and reporting a
// closed job. The agent hosting the store keeps it up until the others have read
// the outcome.
#include <functional>

#include "cohort/elastic/dynamic_rendezvous.h"

namespace cohort::launcher {

enum class Verdict { kFailure, kMembership, kClosed };

// Whether round `r`, in which this node's workers failed (`own`: on their own
// account, not as a peer's casualty), failed or lost a node. Bounded by the
// heartbeat bound; `check` is called between looks and may throw.
Verdict classify(elastic::DynamicRendezvous& rdzv, const elastic::Round& r, bool own,
                 const std::function<void()>& check);

// Every worker here exited 0: the exit barrier, then (hosting) the job's close.
// Returns the agent's exit code.
int finish(elastic::DynamicRendezvous& rdzv, const elastic::Round& r, bool hosting,
           const std::function<void()>& check);

// The job is closed: prints its root cause, if it failed, and returns the exit code.
int report_closed(elastic::DynamicRendezvous& rdzv, bool hosting);

}  // namespace cohort::launcher
