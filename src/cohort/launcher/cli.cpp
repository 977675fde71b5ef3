#include "cohort/launcher/cli.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <filesystem>
#include <sstream>

namespace cohort::launcher {
namespace {

// torchrun accepts both --nproc-per-node and --nproc_per_node.
std::string spellings(const std::string& name) {
  auto underscored = name;
  std::replace(underscored.begin(), underscored.end(), '-', '_');
  return underscored == name ? "--" + name : "--" + name + ",--" + underscored;
}

constexpr const char* kDescription =
    "Starts PROGRAM as a group of worker processes that train together, as torchrun does.\n"
    "Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK,\n"
    "GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_* and (several workers, unset)\n"
    "OMP_NUM_THREADS=1. Output lines are prefixed with the worker's rank. When a worker\n"
    "fails, the others are stopped and the launcher exits 1 naming the first failure\n"
    "(with --fault-tolerance in-process, only the dead worker is restarted: docs/launcher.md).\n"
    "PROGRAM is any executable; it need not link cohort. As with torchrun, every flag\n"
    "can also be set by PET_<NAME> (PET_NPROC_PER_NODE, PET_NNODES, PET_RDZV_ENDPOINT, ...);\n"
    "a flag on the command line takes precedence.\n\n"
    "Usage: cohort run [FLAGS] [--] PROGRAM [ARGS...]";

// Note [PET variables]: "PET_" + the option's first long name, e.g. --nproc-per-node
// -> PET_NPROC_PER_NODE.
std::string pet_name(const CLI::Option& option) {
  std::string name = "PET_" + option.get_lnames().front();
  for (auto& c : name) c = c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

// The options left unset on the command line take their PET_* variable, if any.
// Returns, for each option so set, "PET_NAME=value" by its flag ("--name").
std::map<std::string, std::string> apply_pet_variables(CLI::App& app, const comm::EnvMap& env) {
  std::map<std::string, std::string> from_env;
  for (CLI::Option* option : app.get_options()) {
    if (option == app.get_help_ptr() || option->get_lnames().empty() || option->count() > 0) continue;
    const auto name = pet_name(*option);
    const auto it = env.find(name);
    if (it == env.end() || it->second.empty()) continue;
    const auto flag = "--" + option->get_lnames().front();
    try {
      option->add_result(it->second);
      option->run_callback();
    } catch (const CLI::Error& e) {
      throw UsageError(fmt::format("{}={}: not a valid value for {} ({}); fix or unset the variable (a flag on the "
                                   "command line takes precedence over it)",
                                   name, it->second, flag, e.what()));
    }
    from_env[flag] = name + "=" + it->second;
  }
  return from_env;
}

// A UsageError about a value that came from a PET_* variable names the variable.
UsageError naming_variables(const UsageError& e, const std::map<std::string, std::string>& from_env) {
  const std::string what = e.what();
  for (const auto& [flag, assignment] : from_env)
    if (what.find(flag) != std::string::npos)
      return UsageError(fmt::format("{} (read as {}): {}", assignment, flag, what));
  return e;
}

// What the parsed flags mean together; throws UsageError naming the flag.
void finish_options(CLI::App& app, RunOptions& o, const std::string& nnodes, const std::string& redirects,
                    const std::string& tee, const std::string& filter, int min_replicas) {
  // Given on the command line or by PET_MIN_REPLICAS: validate() refuses it without
  // --fault-tolerance in-process.
  if (app.get_option("--min-replicas")->count() > 0) o.min_replicas = min_replicas;
  auto rest = app.remaining();
  bool separated = !rest.empty() && rest.front() == "--";
  if (separated) rest.erase(rest.begin());
  if (!separated && !rest.empty() && rest.front().size() > 1 && rest.front()[0] == '-')
    throw UsageError(fmt::format("unknown flag {}: see `cohort run --help`; put the program after `--` if its "
                                 "name starts with '-'",
                                 rest.front()));
  if (!rest.empty()) {
    o.program = rest.front();
    o.program_args.assign(rest.begin() + 1, rest.end());
  }
  std::tie(o.min_nodes, o.max_nodes) = parse_nnodes(nnodes);
  o.redirects = parse_stream_selection(redirects, "--redirects");
  o.tee = parse_stream_selection(tee, "--tee");
  if (!filter.empty()) {
    std::set<int> ranks;
    std::stringstream in(filter);
    std::string item;
    while (std::getline(in, item, ',')) {
      int r = -1;
      try {
        r = std::stoi(item);
      } catch (const std::exception&) {
      }
      if (r < 0 || std::to_string(r) != item)
        throw UsageError(fmt::format("--local-ranks-filter {}: give local ranks such as 0 or 0,2", filter));
      ranks.insert(r);
    }
    o.local_ranks_filter = ranks;
  }
  if (!o.timeline_dir.empty()) {
    std::error_code ec;
    auto absolute = std::filesystem::absolute(o.timeline_dir, ec);
    if (!ec) o.timeline_dir = absolute.string();
  }
  if (o.standalone && uses_etcd(o))
    throw UsageError("--standalone makes a store of its own on loopback; drop it with --rdzv-backend etcd");
  if (o.standalone) {
    o.rdzv_backend = "c10d";
    o.rdzv_endpoint = "127.0.0.1:0";
  }
  validate(o);
}

}  // namespace

std::optional<RunOptions> parse_run_command(const std::vector<std::string>& args, std::ostream& out,
                                            const comm::EnvMap& env) {
  RunOptions o;
  std::string nnodes = "1", redirects = "0", tee = "0", filter;
  int min_replicas = 1;
  bool no_python = false;
  CLI::App app(kDescription, "cohort run");
  app.prefix_command();
  app.set_help_flag("-h,--help", "Print this help and exit");
  app.add_option(spellings("nproc-per-node"), o.nproc_per_node,
                 "Workers on this node: N, auto (GPUs if any, else CPUs), cpu (CPU count) or gpu (GPU count)")
      ->default_str("1");
  app.add_option("--nnodes", nnodes, "Number of nodes: N, or MIN:MAX for an elastic job (--rdzv-backend c10d)")
      ->default_str("1");
  app.add_option(spellings("node-rank"), o.node_rank, "This node's rank among the nodes, 0..N-1")->default_str("0");
  app.add_option(spellings("master-addr"), o.master_addr,
                 "Address of node 0, which hosts the rendezvous store")
      ->default_str("127.0.0.1");
  app.add_option(spellings("master-port"), o.master_port,
                 "Port of the rendezvous store on node 0; 0 or absent picks a free port (one node only)")
      ->default_str("0");
  app.add_flag("--standalone", o.standalone,
               "Single node: the elastic rendezvous on loopback with a free port and a fresh token");
  app.add_option(spellings("rdzv-backend"), o.rdzv_backend,
                 "static (fixed nodes, --master-addr/--master-port), c10d (elastic: --rdzv-endpoint) or etcd "
                 "(elastic, the job's state in etcd: --rdzv-endpoint lists its members)")
      ->default_str("static");
  app.add_option(spellings("rdzv-endpoint"), o.rdzv_endpoint,
                 "HOST:PORT of the elastic rendezvous store; the agent on HOST hosts it (port 29400 if absent). "
                 "With --rdzv-backend etcd: HOST:2379[,HOST:2379...], every etcd member's client address");
  app.add_option(spellings("rdzv-conf"), o.rdzv_conf,
                 "join_timeout=S,last_call_timeout=S,close_timeout=S,keep_alive_interval=S,"
                 "keep_alive_max_heartbeats=N; with etcd also protocol=https,cacert=F,cert=F,key=F,user=U "
                 "(password in COHORT_ETCD_PASSWORD)");
  app.add_option(spellings("rdzv-token"), o.rdzv_token,
                 "The job's shared secret; prefer the COHORT_RDZV_TOKEN variable (a flag shows in `ps`)");
  app.add_option(spellings("frozen-timeout"), o.frozen_timeout,
                 "Seconds a worker may stay stopped (SIGSTOP) before it counts as hung and the job restarts")
      ->default_str("5");
  app.add_option(spellings("rdzv-id") + "," + spellings("run-id"), o.run_id,
                 "Job id, exported as TORCHELASTIC_RUN_ID")
      ->default_str("none");
  app.add_option("--role", o.role, "Worker role name (ROLE_NAME)")->default_str("default");
  app.add_option(spellings("max-restarts"), o.max_restarts,
                 "Restart all workers up to this many times after a failure, counted for the whole job "
                 "(with --fault-tolerance in-process: single-worker restarts)")
      ->default_str("0");
  app.add_option(spellings("fault-tolerance"), o.fault_tolerance,
                 "none: a failed worker stops and restarts every worker; in-process: only the dead worker is "
                 "restarted (same RANK, COHORT_FT_INCARNATION+1) and the others go on (one static node)")
      ->default_str("none");
  app.add_option(spellings("min-replicas"), min_replicas,
                 "With --fault-tolerance in-process: the fewest live workers the job trains with "
                 "(COHORT_FT_MIN_REPLICAS)")
      ->default_str("1");
  app.add_option(spellings("monitor-interval"), o.monitor_interval,
                 "Seconds between liveness checks of the workers (exits are also seen at once)")
      ->default_str("0.1");
  app.add_option(spellings("stop-timeout"), o.stop_timeout,
                 "Seconds between SIGTERM and SIGKILL when stopping workers")
      ->default_str("5");
  app.add_option(spellings("join-timeout"), o.join_timeout,
                 "Seconds the agents of a multi-node job wait for each other")
      ->default_str("300");
  app.add_option(spellings("log-dir"), o.log_dir,
                 "Directory for per-worker logs and error files (a temporary one when absent)");
  app.add_option("-r,--redirects", redirects,
                 "Send worker streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or "
                 "local_rank:code pairs such as 0:1,1:3")
      ->default_str("0");
  app.add_option("-t,--tee", tee, "Copy worker streams to log files as well as the console (same codes)")
      ->default_str("0");
  app.add_option(spellings("local-ranks-filter"), filter,
                 "Show console output of these local ranks only, e.g. 0 or 0,2 (logs keep everything)");
  app.add_option("--timeline", o.timeline_dir,
                 "Each worker writes a Chrome trace (Perfetto) of its steps, collectives and DDP buckets to "
                 "DIR/rank-N.json; merge them with `cohort trace merge DIR OUT.json`");
  app.add_option("--timeline-steps", o.timeline_steps, "Record only steps FIRST:LAST (or FIRST:) of --timeline");
  app.add_option("--timeline-max-events", o.timeline_max_events,
                 "Cap on the events each worker keeps for --timeline (default 200000)");
  app.add_flag(spellings("no-python"), no_python, "Accepted for torchrun compatibility: PROGRAM is always executed");

  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    throw UsageError(fmt::format("{}\n  see `cohort run --help`", e.what()));
  }
  const auto from_env = apply_pet_variables(app, env);
  try {
    finish_options(app, o, nnodes, redirects, tee, filter, min_replicas);
  } catch (const UsageError& e) {
    throw naming_variables(e, from_env);
  }
  return o;
}

}  // namespace cohort::launcher
