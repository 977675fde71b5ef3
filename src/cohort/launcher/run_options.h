#pragma once
// What `cohort run` was asked to do, as plain data. cli.h fills it from the command
// line; validate() checks it before anything is started, so a bad flag never leaves
// a process or a port behind.
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cohort/errors.h"

namespace cohort::elastic {
enum class WorkerStore;
}

namespace cohort::launcher {

// A mistake on the command line: `cohort run` exits with code 2 and prints it.
class UsageError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

// torchrun's --redirects/--tee values: "3" for every local rank, or "0:1,2:3" per
// local rank. 0 = none, 1 = stdout, 2 = stderr, 3 = both.
struct StreamSelection {
  int all = 0;
  std::map<int, int> per_local_rank;
  int for_local_rank(int local_rank) const;
  bool stdout_for(int local_rank) const { return for_local_rank(local_rank) & 1; }
  bool stderr_for(int local_rank) const { return for_local_rank(local_rank) & 2; }
  bool any() const;
};
StreamSelection parse_stream_selection(const std::string& text, const std::string& flag);

struct RunOptions {
  std::string nproc_per_node = "1";  // N | auto | cpu | gpu
  int min_nodes = 1;
  int max_nodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port
  bool standalone = false;
  std::string run_id = "none";
  std::string role = "default";
  // Elastic rendezvous (torchrun's --rdzv-*). "static" is the fixed-size
  // --master-addr/--master-port rendezvous; "c10d" the elastic one
  // (launcher/elastic_agent.h), which --standalone implies.
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;  // HOST[:PORT], default port 29400
  std::string rdzv_conf;
  std::string rdzv_token;  // --rdzv-token, else COHORT_RDZV_TOKEN
  int max_restarts = 0;
  // --fault-tolerance: "none" (a failure stops and restarts every worker) or
  // "in-process" (only the dead worker is restarted; launcher/in_process.h).
  std::string fault_tolerance = "none";
  // --min-replicas, for in-process only (unset: 1), exported as COHORT_FT_MIN_REPLICAS.
  std::optional<int> min_replicas;
  double monitor_interval = 0.1;  // seconds
  double stop_timeout = 5.0;      // seconds between SIGTERM and SIGKILL
  double join_timeout = 300.0;    // seconds for the agents of a multi-node job to meet
  double frozen_timeout = 5.0;    // seconds a worker may stay stopped (SIGSTOP) before it counts as hung
  std::string log_dir;
  StreamSelection redirects;
  StreamSelection tee;
  std::optional<std::set<int>> local_ranks_filter;
  // --timeline DIR (made absolute), --timeline-steps FIRST:LAST, --timeline-max-events N:
  // exported to the workers as COHORT_TIMELINE_* (trace/timeline.h).
  std::string timeline_dir;
  std::string timeline_steps;
  long timeline_max_events = 0;  // 0: the library's default
  std::string program;
  std::vector<std::string> program_args;
  // Whether the launcher's stdout and stderr are terminals. `cohort run` fills them
  // in before its ConsoleRelay puts pipes in their place (Note [Never stalled by the
  // console]); unset, isatty() answers.
  std::optional<bool> stdout_is_tty;
  std::optional<bool> stderr_is_tty;
};

// --rdzv-backend c10d or etcd (and --standalone): the elastic agent
// (launcher/elastic_agent.h).
bool is_elastic(const RunOptions& options);

// --rdzv-backend etcd (or etcd-v2): the elastic agent keeps the job's rendezvous,
// workers' store and fault-tolerance keys in an etcd cluster (docs/etcd.md), and no
// agent hosts a store.
bool uses_etcd(const RunOptions& options);

// Note [--rdzv-conf under etcd]: --rdzv-conf holds the rendezvous's keys and, under
// etcd, torchrun's etcd keys (protocol, cacert, cert, key) and cohort's `user`.
// rendezvous_conf() is the rendezvous's part, etcd_conf() the etcd part. Throws
// UsageError for an etcd key given to another backend.
std::string rendezvous_conf(const RunOptions& options);
std::map<std::string, std::string> etcd_conf(const RunOptions& options);

// --fault-tolerance in-process: the launcher restarts only a worker that died
// (launcher/in_process.h).
bool in_process_fault_tolerance(const RunOptions& options);

// --min-replicas against the job's size, once the worker count is known (validate()
// checks it when --nproc-per-node is a number). Throws UsageError naming the flag.
void check_min_replicas(const RunOptions& options, int world_size);

// What the workers' MASTER_ADDR/MASTER_PORT lead to (Note [The workers' store] in
// launcher/worker_store.h): --rdzv-conf worker_store, whose default is cohort's
// authenticated store, except for a static job of several nodes, which shares node
// 0's c10d TCPStore as torchrun's does.
elastic::WorkerStore worker_store_of(const RunOptions& options);

// "HOST:PORT" or "HOST" (port 29400, torchrun's default), IPv6 in brackets.
struct Endpoint {
  std::string host;
  int port = 29400;
};
Endpoint parse_endpoint(const std::string& text, const std::string& flag);

// "2" -> {2,2}; "1:4" -> {1,4}. Throws UsageError for "1:2:3", "3:1", "0", "-1".
std::pair<int, int> parse_nnodes(const std::string& text);

// Resolves --nproc-per-node against what the host has, as torchrun does: auto is the
// GPU count when there are GPUs and the CPU count otherwise.
int resolve_nproc(const std::string& spec, int cpu_count, int gpu_count);

// Checks everything that can be checked without side effects. Throws UsageError
// naming the flag and the fix.
void validate(const RunOptions& options);

// The program as it will be executed: an absolute path found through PATH (or
// the given path when it contains '/'). Throws UsageError when it is missing or not
// executable.
std::string resolve_program(const std::string& program, const std::string& path_env);

}  // namespace cohort::launcher
