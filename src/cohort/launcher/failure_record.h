#pragma once
// A node's failed round as the other nodes read it: posted under the round in the
// store, so that the agent that closes a failed job can name the root cause over
// every node (Note [Elastic agent loop]), not just its own.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cohort/elastic/dynamic_rendezvous.h"
#include "cohort/launcher/failure.h"
#include "cohort/launcher/worker_group.h"

namespace cohort::launcher {

struct FailureRecord {
  bool own = false;  // the root cause here failed on its own account, not as a casualty
  std::int64_t time_ms = 0;  // when it exited
  std::string summary;       // failure_summary() of this node
};

// Posts this node's outcome of round `r` and returns it.
FailureRecord post_failure_record(elastic::DynamicRendezvous& rdzv, const elastic::Round& r,
                                  const AttemptResult& result, const FailureContext& context);
// The records posted so far for round `r`, by any node.
std::vector<FailureRecord> read_failure_records(elastic::DynamicRendezvous& rdzv, const elastic::Round& r);

// The job cannot go on (its restarts are used up, or a node failed or was lost after
// another had finished): waits briefly for the other nodes' records, writes the root
// cause (the earliest own failure, else the earliest failure) followed by `why`,
// and closes the job. `check` is called between looks and may throw (the agent's
// signals).
void close_with_root_cause(elastic::DynamicRendezvous& rdzv, const elastic::Round& r, const std::string& why,
                           const std::function<void()>& check = nullptr);
// Closes the job on every node with `text` as the root cause each prints (what
// close_with_root_cause does once it has gathered the records).
void close_with_text(elastic::DynamicRendezvous& rdzv, const std::string& text);
// What close_with_root_cause wrote; empty when the job closed because it finished.
std::string read_root_cause(elastic::DynamicRendezvous& rdzv);

}  // namespace cohort::launcher
