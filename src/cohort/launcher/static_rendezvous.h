#pragma once
// Static rendezvous: a fixed set of nodes. Node 0's agent hosts the job's store
// (workers connect to it as TORCHELASTIC_USE_AGENT_STORE clients); every agent
// publishes how many workers it runs, and global ranks follow node order. Which
// store that is follows Note [The workers' store] (launcher/worker_store.h): for
// one node, by default, cohort's authenticated store on 127.0.0.1; else c10d's
// TCPStore.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cohort/comm/environment.h"
#include "cohort/compat/c10d.h"
#include "cohort/launcher/run_options.h"
#include "cohort/launcher/stock_worker_watch.h"
#include "cohort/store/store_server.h"

namespace cohort::launcher {

struct Assignment {
  int group_rank = 0;
  int group_world_size = 1;
  int base_rank = 0;  // global rank of this node's local rank 0
  int world_size = 1;
};

// Pure: node `node_rank`'s share given every node's worker count.
Assignment assign_ranks(const std::vector<int>& local_world_sizes, int node_rank);

// Fails with UsageError when `port` is taken on this host (0 is always free).
void check_port_free(int port);

class StaticRendezvous {
 public:
  // Hosts the store (node 0) or connects to it (others). Throws UsageError for a
  // busy port, TimeoutError when node 0 cannot be reached within `timeout`. A
  // single-node job's store (cohort's) uses `certificates` where they are given.
  // `watch` sees the hosted store's refusals (Note [Telling a stock worker from a
  // port scan]).
  StaticRendezvous(const RunOptions& options, std::chrono::milliseconds timeout,
                   store::Certificates certificates = {}, std::shared_ptr<StockWorkerWatch> watch = nullptr);

  // Exchanges worker counts with the other agents, bounded by the timeout; the error
  // names the node ranks that never arrived.
  Assignment assign(int local_world_size);
  // Every node's worker count, in node order, once assign() has returned.
  const std::vector<int>& node_sizes() const { return node_sizes_; }
  // Called when this node's workers are done. Node 0 waits until every node is done,
  // because its store must outlive every worker (Note [Static exit barrier]): bounded by the
  // timeout, and cut short by SIGINT, SIGTERM or SIGHUP arriving on `signal_fd` (the
  // launcher's self-pipe). Returns that signal, or 0.
  int finish(int signal_fd);

  // The other nodes' --nnodes must match ours; node 0's is published in assign().
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  // What workers of `attempt` need beyond the torchrun contract to reach the store:
  // its token and their prefix when it is cohort's store; nothing for a TCPStore.
  comm::EnvMap worker_variables(int attempt) const;
  // The workers' key prefix in `attempt`: COHORT_STORE_PREFIX for cohort's store,
  // torchrun's "/worker/attempt_<n>" for a TCPStore (comm::world_info_from).
  std::string worker_prefix(int attempt) const;
  // A new client of the store, under worker_prefix(attempt): it sees the keys
  // exactly where the workers of `attempt` see them (launcher/in_process.h). Each of
  // its operations is bounded by `timeout`. Throws what connecting throws.
  c10::intrusive_ptr<c10d::Store> workers_view(int attempt, std::chrono::milliseconds timeout) const;

 private:
  void host_authenticated_store();

  RunOptions options_;
  std::chrono::milliseconds timeout_;
  store::Certificates certificates_;
  std::shared_ptr<StockWorkerWatch> watch_;
  std::string address_;
  int port_ = 0;
  c10::intrusive_ptr<c10d::Store> store_;
  std::vector<int> node_sizes_;                 // set by assign()
  std::string token_;                           // set with server_
  std::unique_ptr<store::StoreServer> server_;  // cohort's store, for one node
};

}  // namespace cohort::launcher
