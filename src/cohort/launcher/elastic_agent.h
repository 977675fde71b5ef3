#pragma once
// The elastic agent (--rdzv-backend c10d, and --standalone): torchrun's agent loop
// over cohort's authenticated store.
//
// Note [Elastic agent loop]
//   join a round -> agree worker ranks -> start the workers -> watch them and the
//   record; then, by what happened:
//  - every worker exited 0: say so in the store; the agent hosting the store waits
//    (close_timeout) for the other nodes to say the same before closing the job;
//  - a membership change (a node waits to join, one left or was dropped, the round
//    moved on): stop the workers, leave, join the next round; no restart is used;
//  - a worker failed: post its outcome under the round, then decide whether the
//    round failed or lost a node. When only casualties failed here (peers' broken
//    connections), the agent waits up to the heartbeat bound for either another
//    node's own failure (a failure) or a node dropped (a membership change).
//    A node already seen gone makes it a membership change even when a worker
//    here failed on its own account: its death may have caused that failure.
//    A failure is counted once per round in the shared record, against
//    --max-restarts for the whole job; when none are left, the agent that notices
//    writes the root cause (earliest own failure over every node) and closes the
//    job, and every agent prints that root cause and exits 1;
//  - the store stopped answering (its host died): stop the workers, exit 1 naming
//    the store's address.
// Under --fault-tolerance in-process the round is held (Note [Held rounds] in
// elastic/rendezvous_state.h): a dead worker is replaced alone (launcher/in_process.h),
// only the job's close or this node's own drop stops the workers, and when they have
// all exited the agent goes to the exit barrier, whatever their outcome.
// Workers reach the store at the endpoint, under a prefix per round
// (COHORT_STORE_PREFIX), so the one port serves every round, and
// TORCHELASTIC_RESTART_COUNT is the job's failure-restart count.
#include <filesystem>
#include <functional>
#include <string>

#include "cohort/comm/environment.h"
#include "cohort/launcher/run_options.h"

namespace cohort::launcher {

struct AgentSetup {
  const RunOptions& options;
  const comm::EnvMap& env;
  std::string program;
  int nproc = 1;
  std::string run_id;
  std::function<std::filesystem::path(int)> attempt_dir;
  int signal_fd = -1;  // the launcher's signal self-pipe
};

// Returns the launcher's exit code, as run_agent does.
int run_elastic_agent(const AgentSetup& setup);

}  // namespace cohort::launcher
