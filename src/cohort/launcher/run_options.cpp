#include "cohort/launcher/run_options.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "cohort/elastic/rendezvous_state.h"
#include "cohort/store/etcd_options.h"
#include "cohort/trace/timeline.h"
#include "cohort/util/parse.h"

namespace cohort::launcher {
namespace {

long parse_flag_int(const std::string& text, const std::string& flag) {
  try {
    return util::parse_long(text, flag);
  } catch (const ConfigError&) {
    throw UsageError(fmt::format("{} {}: expected an integer", flag, text));
  }
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!s.empty() && s.back() == sep) parts.emplace_back();
  return parts;
}

int parse_stream_code(const std::string& code, const std::string& flag, const std::string& whole) {
  long v = -1;
  try {
    v = util::parse_long(code, flag);
  } catch (const ConfigError&) {
  }
  if (v < 0 || v > 3)
    throw UsageError(fmt::format("{} {}: use 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or local_rank:code "
                                 "pairs such as 0:1,1:3",
                                 flag, whole));
  return static_cast<int>(v);
}

}  // namespace

int StreamSelection::for_local_rank(int local_rank) const {
  auto it = per_local_rank.find(local_rank);
  return it == per_local_rank.end() ? all : it->second;
}

bool StreamSelection::any() const {
  if (all) return true;
  for (const auto& [rank, code] : per_local_rank)
    if (code) return true;
  return false;
}

StreamSelection parse_stream_selection(const std::string& text, const std::string& flag) {
  StreamSelection sel;
  if (text.find(':') == std::string::npos) {
    sel.all = parse_stream_code(text, flag, text);
    return sel;
  }
  for (const auto& item : split(text, ',')) {
    auto colon = item.find(':');
    if (colon == std::string::npos)
      throw UsageError(fmt::format("{} {}: mix of forms; give one code (\"3\") or local_rank:code pairs "
                                   "(\"0:1,1:3\")",
                                   flag, text));
    auto rank = parse_flag_int(item.substr(0, colon), flag);
    if (rank < 0) throw UsageError(fmt::format("{} {}: local rank {} is negative", flag, text, rank));
    sel.per_local_rank[static_cast<int>(rank)] = parse_stream_code(item.substr(colon + 1), flag, text);
  }
  return sel;
}

std::pair<int, int> parse_nnodes(const std::string& text) {
  auto parts = split(text, ':');
  if (parts.empty() || parts.size() > 2)
    throw UsageError(fmt::format("--nnodes {}: give N or MIN:MAX, e.g. --nnodes 2 or --nnodes 1:4", text));
  auto lo = parse_flag_int(parts[0], "--nnodes");
  auto hi = parts.size() == 2 ? parse_flag_int(parts[1], "--nnodes") : lo;
  if (lo < 1) throw UsageError(fmt::format("--nnodes {}: the minimum number of nodes must be at least 1", text));
  if (hi < lo) throw UsageError(fmt::format("--nnodes {}: MIN {} is greater than MAX {}; write MIN:MAX", text, lo, hi));
  return {static_cast<int>(lo), static_cast<int>(hi)};
}

bool is_elastic(const RunOptions& o) { return o.rdzv_backend == "c10d" || uses_etcd(o); }

bool uses_etcd(const RunOptions& o) { return o.rdzv_backend == "etcd" || o.rdzv_backend == "etcd-v2"; }

namespace {

// The items of --rdzv-conf that belong to etcd (`etcd` true) or to the rendezvous.
std::vector<std::pair<std::string, std::string>> conf_part(const RunOptions& o, bool etcd) {
  std::vector<std::pair<std::string, std::string>> part;
  try {
    for (auto& item : elastic::rdzv_conf_items(o.rdzv_conf)) {
      const bool etcd_key = store::etcd_conf_keys().count(item.first) > 0;
      if (etcd_key && !uses_etcd(o))
        throw UsageError(fmt::format("--rdzv-conf {}={}: belongs to the etcd rendezvous; add --rdzv-backend etcd "
                                     "--rdzv-endpoint HOST:2379[,HOST:2379...], or drop it",
                                     item.first, item.second));
      if (etcd_key == etcd) part.push_back(std::move(item));
    }
  } catch (const UsageError&) {
    throw;
  } catch (const ConfigError& e) {
    throw UsageError(e.what());
  }
  return part;
}

}  // namespace

std::string rendezvous_conf(const RunOptions& o) {
  std::string conf;
  for (const auto& [key, value] : conf_part(o, false)) conf += (conf.empty() ? "" : ",") + key + "=" + value;
  return conf;
}

std::map<std::string, std::string> etcd_conf(const RunOptions& o) {
  const auto part = conf_part(o, true);
  return {part.begin(), part.end()};
}

bool in_process_fault_tolerance(const RunOptions& o) { return o.fault_tolerance == "in-process"; }

void check_min_replicas(const RunOptions& o, int world_size) {
  if (!o.min_replicas) return;
  if (*o.min_replicas > world_size)
    throw UsageError(fmt::format("--min-replicas {}: the job has only {} worker(s) (--nproc-per-node x --nnodes); "
                                 "give at most {}",
                                 *o.min_replicas, world_size, world_size));
}

elastic::WorkerStore worker_store_of(const RunOptions& o) {
  const auto keys = elastic::rdzv_conf_keys(o.rdzv_conf);
  if (!is_elastic(o) && o.max_nodes > 1 && std::find(keys.begin(), keys.end(), "worker_store") == keys.end())
    return elastic::WorkerStore::kTcpStore;
  return elastic::parse_rdzv_conf(rendezvous_conf(o), elastic::RendezvousSettings(o.min_nodes, o.max_nodes))
      .worker_store();
}

Endpoint parse_endpoint(const std::string& text, const std::string& flag) {
  Endpoint e;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string::npos) throw UsageError(fmt::format("{} {}: unclosed '['", flag, text));
    e.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') throw UsageError(fmt::format("{} {}: write [ADDRESS]:PORT", flag, text));
      port = text.substr(close + 2);
    }
  } else {
    auto colon = text.rfind(':');
    e.host = text.substr(0, colon);
    if (colon != std::string::npos) port = text.substr(colon + 1);
    if (e.host.find(':') != std::string::npos)
      throw UsageError(fmt::format("{} {}: put an IPv6 address in brackets, [ADDRESS]:PORT", flag, text));
  }
  if (e.host.empty()) throw UsageError(fmt::format("{} {}: give HOST:PORT, e.g. node0.example:29400", flag, text));
  if (!port.empty() || text.back() == ':') {
    long p = -1;
    try {
      p = util::parse_long(port, flag);
    } catch (const ConfigError&) {
    }
    if (p < 0 || p > 65535)
      throw UsageError(fmt::format("{} {}: '{}' is not a TCP port (0-65535)", flag, text, port));
    e.port = static_cast<int>(p);
  }
  return e;
}

int resolve_nproc(const std::string& spec, int cpu_count, int gpu_count) {
  if (spec == "auto") return gpu_count > 0 ? gpu_count : cpu_count;
  if (spec == "cpu") return cpu_count;
  if (spec == "gpu") {
    if (gpu_count == 0)
      throw UsageError("--nproc-per-node gpu: this host sees no GPU; use a number, cpu or auto");
    return gpu_count;
  }
  auto n = parse_flag_int(spec, "--nproc-per-node");
  if (n < 1)
    throw UsageError(fmt::format("--nproc-per-node {}: start at least 1 worker (or give auto, cpu or gpu)", spec));
  return static_cast<int>(n);
}

namespace {

// What every backend checks.
void validate_timeline(const RunOptions& o) {
  if (o.timeline_dir.empty()) {
    if (!o.timeline_steps.empty() || o.timeline_max_events != 0)
      throw UsageError("--timeline-steps and --timeline-max-events shape --timeline DIR; add --timeline DIR");
    return;
  }
  if (o.timeline_max_events < 0)
    throw UsageError(fmt::format("--timeline-max-events {}: give a positive count of events", o.timeline_max_events));
  if (!o.timeline_steps.empty()) {
    try {
      trace::TimelineOptions().steps_from_string(o.timeline_steps, "--timeline-steps");
    } catch (const ConfigError& e) {
      throw UsageError(e.what());
    }
  }
}

void validate_common(const RunOptions& o) {
  if (o.max_restarts < 0)
    throw UsageError(fmt::format("--max-restarts {}: must be 0 or more", o.max_restarts));
  for (auto [flag, value] : {std::pair<const char*, double>{"--monitor-interval", o.monitor_interval},
                             {"--stop-timeout", o.stop_timeout},
                             {"--join-timeout", o.join_timeout},
                             {"--frozen-timeout", o.frozen_timeout}}) {
    try {
      util::timeout_from_seconds(value, flag);
    } catch (const ConfigError& e) {
      throw UsageError(e.what());
    }
  }
  if (o.program.empty())
    throw UsageError("no program given: cohort run [flags] [--] PROGRAM [ARGS...]");
  validate_timeline(o);
}

// The static launcher takes one --rdzv-conf key, worker_store.
void validate_static_conf(const RunOptions& o) {
  try {
    for (const auto& key : elastic::rdzv_conf_keys(o.rdzv_conf))
      if (key != "worker_store")
        throw UsageError(fmt::format("--rdzv-conf {}: belongs to the elastic rendezvous (add --rdzv-backend c10d); "
                                     "the static launcher takes only worker_store",
                                     key));
    const auto store = worker_store_of(o);  // checks the value too
    if (o.max_nodes > 1 && store == elastic::WorkerStore::kCohort)
      throw UsageError("--rdzv-conf worker_store=cohort: the nodes of a static job share node 0's c10d TCPStore; "
                       "for cohort's authenticated store use the elastic rendezvous (--rdzv-backend c10d "
                       "--rdzv-endpoint HOST:PORT)");
  } catch (const UsageError&) {
    throw;
  } catch (const ConfigError& e) {
    throw UsageError(e.what());
  }
}

// Note [--rdzv-backend etcd]: the etcd members' client addresses, the etcd keys of
// --rdzv-conf and COHORT_ETCD_PASSWORD are checked as the workers will read them
// (store::etcd_options_for_run); the store itself is first reached by the agent.
void validate_etcd(const RunOptions& o) {
  if (o.rdzv_endpoint.empty())
    throw UsageError("--rdzv-endpoint: --rdzv-backend etcd needs the etcd members' client addresses, "
                     "HOST:2379[,HOST:2379...] (give every member, so that the job outlives any one of them)");
  // Jobs share an etcd cluster, and the default id would make two of them one.
  if (o.run_id == "none")
    throw UsageError("--rdzv-id: --rdzv-backend etcd keeps each job under its run id, and jobs without one would "
                     "share the keys of `none`, joining one another's rendezvous; give every node of the job the "
                     "same --rdzv-id of its own (a scheduler's job id)");
  try {
    store::parse_etcd_endpoints(o.rdzv_endpoint);
    const auto conf = etcd_conf(o);
    for (const auto& [key, value] : conf)
      if (value.empty()) throw UsageError(fmt::format("--rdzv-conf {}=: give a value, or drop the key", key));
    // The password is the agent's environment's; only its presence matters here.
    std::map<std::string, std::string> env;
    if (conf.count("user")) env[store::kEtcdPasswordVariable] = "checked-by-the-agent";
    store::etcd_options_for_run(o.rdzv_endpoint, o.run_id, conf, env);
    if (elastic::parse_rdzv_conf(rendezvous_conf(o), elastic::RendezvousSettings(o.min_nodes, o.max_nodes))
            .worker_store() == elastic::WorkerStore::kTcpStore)
      throw UsageError("--rdzv-conf worker_store=tcpstore: under --rdzv-backend etcd the workers' store is the job's "
                       "etcd, which stock c10d workers cannot speak, and a TCPStore hosted by one agent would be the "
                       "single point of failure etcd removes; drop worker_store=tcpstore (cohort's workers need "
                       "nothing), or use --rdzv-backend c10d for stock c10d workers");
  } catch (const UsageError&) {
    throw;
  } catch (const ConfigError& e) {
    throw UsageError(fmt::format("--rdzv-endpoint {}: {}", o.rdzv_endpoint, e.what()));
  }
}

void validate_elastic(const RunOptions& o) {
  if (uses_etcd(o)) validate_etcd(o);
  if (o.rdzv_endpoint.empty())
    throw UsageError("--rdzv-endpoint: the elastic rendezvous needs HOST:PORT of the agent that hosts its store "
                     "(every node passes the same), or --standalone for one node");
  const auto endpoint = uses_etcd(o) ? Endpoint{} : parse_endpoint(o.rdzv_endpoint, "--rdzv-endpoint");
  if (endpoint.port == 0 && !o.standalone)
    throw UsageError(fmt::format("--rdzv-endpoint {}: port 0 only works with --standalone; every node must know "
                                 "the port, so give one (torchrun's default is 29400)",
                                 o.rdzv_endpoint));
  try {
    elastic::parse_rdzv_conf(rendezvous_conf(o), elastic::RendezvousSettings(o.min_nodes, o.max_nodes));
  } catch (const UsageError&) {
    throw;
  } catch (const ConfigError& e) {
    throw UsageError(e.what());
  }
  if (o.node_rank != 0)
    throw UsageError("--node-rank: the elastic rendezvous gives node ranks itself; drop the flag");
  if (o.standalone && o.max_nodes > 1)
    throw UsageError("--standalone runs a single node; drop it, or use --nnodes 1");
  validate_common(o);
}

// Note [In-process fault tolerance needs a world that keeps its shape]
// The launcher replaces a dead worker with the same RANK on the same store: every
// agent publishes the deaths of its own workers under their global ranks on the
// job's store (Note [In-process fault tolerance: the keys]), and an agent that
// disappears with its node publishes nothing; the survivors drop its workers at
// their collective or quorum deadline. Static nodes take them back when the node's
// agent is started again with the same --node-rank; the elastic agent holds its
// round (Note [Held rounds] in elastic/rendezvous_state.h), so any node that comes
// takes the vacant slot. --standalone is refused (a random run id and port: nothing
// a restarted node could find again), and so is worker_store=tcpstore, whose
// workers' store the agent does not reach with its own client.
void validate_fault_tolerance(const RunOptions& o) {
  if (o.fault_tolerance != "none" && o.fault_tolerance != "in-process")
    throw UsageError(fmt::format("--fault-tolerance {}: use none (a failure restarts every worker) or in-process "
                                 "(only the dead worker is restarted)",
                                 o.fault_tolerance));
  if (!in_process_fault_tolerance(o)) {
    if (o.min_replicas)
      throw UsageError("--min-replicas only applies to --fault-tolerance in-process; add --fault-tolerance "
                       "in-process, or drop --min-replicas");
    return;
  }
  if (o.min_replicas && *o.min_replicas < 1)
    throw UsageError(fmt::format("--min-replicas {}: must be at least 1", *o.min_replicas));
  if (o.standalone)
    throw UsageError("--fault-tolerance in-process: not supported with --standalone yet; drop --standalone (the "
                     "static rendezvous of one node runs it), or use --fault-tolerance none with --max-restarts");
  if (is_elastic(o)) {
    auto store = elastic::WorkerStore::kCohort;
    try {
      store = elastic::parse_rdzv_conf(rendezvous_conf(o), elastic::RendezvousSettings(o.min_nodes, o.max_nodes))
                  .worker_store();
    } catch (const ConfigError&) {
      // validate_elastic names it (UsageError is one)
    }
    if (store == elastic::WorkerStore::kTcpStore)
      throw UsageError("--fault-tolerance in-process: not supported with --rdzv-conf worker_store=tcpstore yet (the "
                       "agents publish deaths in cohort's store); drop worker_store=tcpstore, or use "
                       "--fault-tolerance none");
  }
}

}  // namespace

void validate(const RunOptions& o) {
  validate_fault_tolerance(o);  // Note [In-process fault tolerance needs a world that keeps its shape]
  if (o.nproc_per_node != "auto" && o.nproc_per_node != "cpu" && o.nproc_per_node != "gpu") {
    const int nproc = resolve_nproc(o.nproc_per_node, 1, 0);
    check_min_replicas(o, nproc * o.max_nodes);
  }
  if (o.rdzv_backend != "static" && !is_elastic(o))
    throw UsageError(fmt::format("--rdzv-backend {}: use c10d (elastic, cohort's authenticated store), etcd "
                                 "(elastic, the job's state in an etcd cluster: no single point of failure) or static",
                                 o.rdzv_backend));
  if (is_elastic(o)) {
    validate_elastic(o);
    return;
  }
  if (o.min_nodes != o.max_nodes)
    throw UsageError(fmt::format("--nnodes {}:{}: an elastic range needs the elastic rendezvous; add "
                                 "--rdzv-backend c10d --rdzv-endpoint HOST:PORT",
                                 o.min_nodes, o.max_nodes));
  if (!o.rdzv_endpoint.empty())
    throw UsageError("--rdzv-endpoint belongs to the elastic rendezvous; add --rdzv-backend c10d");
  validate_static_conf(o);
  if (o.node_rank < 0 || o.node_rank >= o.max_nodes)
    throw UsageError(fmt::format("--node-rank {}: must be in [0, {}) for --nnodes {}", o.node_rank, o.max_nodes,
                                 o.max_nodes));
  if (o.master_port < 0 || o.master_port > 65535)
    throw UsageError(fmt::format("--master-port {}: not a TCP port; use 1-65535, or 0 for a free one",
                                 o.master_port));
  if (o.max_nodes > 1 && o.master_port == 0)
    throw UsageError("--master-port: a job of several nodes needs a fixed port that every node agrees on; pass "
                     "--master-port PORT (and --master-addr HOST of node 0)");
  if (o.max_nodes > 1 && o.standalone)
    throw UsageError("--standalone runs a single node; drop it, or use --nnodes 1");
  // Each node's agent replaces its own dead workers alone under in-process fault
  // tolerance; restarting every worker of several static nodes is not coordinated.
  if (o.max_nodes > 1 && o.max_restarts > 0 && !in_process_fault_tolerance(o))
    throw UsageError("--max-restarts: restarting a job of several nodes needs the elastic rendezvous; add "
                     "--rdzv-backend c10d --rdzv-endpoint HOST:PORT (or --fault-tolerance in-process, where each "
                     "node's agent replaces only its dead workers)");
  validate_common(o);
}

std::string resolve_program(const std::string& program, const std::string& path_env) {
  auto usable = [](const std::string& p) {
    struct stat st {};
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    if (usable(program)) return program;
    throw UsageError(fmt::format("program '{}' does not exist or is not executable; check the path (and chmod +x)",
                                 program));
  }
  for (const auto& dir : split(path_env, ':')) {
    auto candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (usable(candidate)) return candidate;
  }
  throw UsageError(fmt::format("program '{}' was not found on PATH; give its path (./{} for one in this "
                               "directory)",
                               program, program));
}

}  // namespace cohort::launcher
