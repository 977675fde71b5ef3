#include "cohort/comm/environment.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>

#include "cohort/comm/slurm.h"
#include "cohort/errors.h"
#include "cohort/store/etcd_options.h"
#include "cohort/util/parse.h"

extern char** environ;

namespace cohort::comm {
namespace {

std::optional<std::string> lookup(const EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

std::optional<int> lookup_int(const EnvMap& env, const std::string& name) {
  auto text = lookup(env, name);
  if (!text) return std::nullopt;
  long value = util::parse_long(*text, "environment variable " + name);
  if (value < INT32_MIN || value > INT32_MAX)
    throw ConfigError("environment variable " + name + ": '" + *text + "' is out of range");
  return static_cast<int>(value);
}

int require_int(const EnvMap& env, const std::string& name, const std::string& why) {
  auto value = lookup_int(env, name);
  if (!value) throw ConfigError(name + " is not set, but " + why);
  return *value;
}

[[noreturn]] void inconsistent(const char* source, const std::string& what) {
  throw ConfigError(std::string("inconsistent ") + source + " environment: " + what);
}

// Ranks and sizes, checked before anything divides by a size.
void validate_sizes(const WorldInfo& w, const char* source) {
  auto fail = [&](const std::string& what) { inconsistent(source, what); };
  if (w.world_size < 1) fail("world size " + std::to_string(w.world_size) + " must be >= 1");
  if (w.rank < 0 || w.rank >= w.world_size)
    fail("rank " + std::to_string(w.rank) + " is outside [0, " + std::to_string(w.world_size) + ")");
  if (w.local_world_size < 1 || w.local_world_size > w.world_size)
    fail("local world size " + std::to_string(w.local_world_size) + " must be in [1, world size " +
         std::to_string(w.world_size) + "]");
  if (w.local_rank < 0 || w.local_rank >= w.local_world_size)
    fail("local rank " + std::to_string(w.local_rank) + " is outside [0, " +
         std::to_string(w.local_world_size) + ")");
}

// Every launcher must end up with a self-consistent world.
void validate(const WorldInfo& w, const char* source) {
  validate_sizes(w, source);
  if (w.world_size > 1 && (w.master_port < 1 || w.master_port > 65535))
    inconsistent(source, "master port " + std::to_string(w.master_port) + " is not a TCP port (1-65535)");
}

WorldInfo from_torchrun(const EnvMap& env) {
  WorldInfo w;
  w.source = WorldSource::kTorchrun;
  w.rank = require_int(env, "RANK", "WORLD_SIZE is set; set both, or neither for a world of one");
  w.world_size = require_int(env, "WORLD_SIZE", "RANK is set; set both, or neither for a world of one");
  // A hand-written launch may give only RANK and WORLD_SIZE: assume one node.
  w.local_rank = lookup_int(env, "LOCAL_RANK").value_or(w.rank);
  auto local_size = lookup_int(env, "LOCAL_WORLD_SIZE");
  w.local_world_size = local_size.value_or(w.world_size);
  w.local_world_size_given = local_size.has_value();
  w.node_rank = lookup_int(env, "GROUP_RANK").value_or(0);
  validate_sizes(w, "torchrun");
  w.num_nodes = lookup_int(env, "GROUP_WORLD_SIZE").value_or(w.world_size / w.local_world_size);
  w.restart_count = lookup_int(env, "TORCHELASTIC_RESTART_COUNT").value_or(0);
  w.max_restarts = lookup_int(env, "TORCHELASTIC_MAX_RESTARTS").value_or(0);
  w.run_id = lookup(env, "TORCHELASTIC_RUN_ID").value_or("");
  auto agent = lookup(env, "TORCHELASTIC_USE_AGENT_STORE").value_or("False");
  w.use_agent_store = agent == "True" || agent == "true" || agent == "1";
  w.store_prefix = lookup(env, "COHORT_STORE_PREFIX").value_or("/worker/attempt_" + std::to_string(w.restart_count));
  if (w.use_agent_store && lookup(env, "COHORT_AGENT_STORE").value_or("") == "cohort") {
    w.cohort_agent_store = true;
    w.store_token = lookup(env, "COHORT_RDZV_TOKEN").value_or("");
    if (w.store_token.empty())
      throw ConfigError("COHORT_AGENT_STORE=cohort but COHORT_RDZV_TOKEN is empty: the agent's store admits only "
                        "holders of the job's token; start the program with `cohort run`, which sets both");
    w.store_certificates = store::certificates_from(env);
  }
  // Checked here, so that a bad variable is named at once; make_world_store opens it
  // (Note [A worker's etcd store] in comm/rendezvous.cpp).
  if (w.use_agent_store && lookup(env, "COHORT_AGENT_STORE").value_or("") == "etcd")
    store::etcd_options_from_worker_env(env);
  if (w.world_size > 1 || w.use_agent_store) {
    auto addr = lookup(env, "MASTER_ADDR");
    if (!addr)
      throw ConfigError("MASTER_ADDR is not set for a world of " + std::to_string(w.world_size) +
                        ": set MASTER_ADDR and MASTER_PORT, or start the program with `cohort run`");
    w.master_addr = *addr;
    w.master_port = require_int(env, "MASTER_PORT", "MASTER_ADDR is set; set the port rank 0 listens on");
  }
  validate(w, "torchrun");
  return w;
}

// SLURM gives no rendezvous port; derive one from the job and step so that every
// task of a step agrees on it and two steps of one job do not collide.
int slurm_default_port(const EnvMap& env) {
  long job = lookup_int(env, "SLURM_JOB_ID").value_or(0);
  long step = lookup_int(env, "SLURM_STEP_ID").value_or(0);
  return 15000 + static_cast<int>((job * 7 + step) % 20000);
}

WorldInfo from_slurm(const EnvMap& env) {
  WorldInfo w;
  w.source = WorldSource::kSlurm;
  w.rank = require_int(env, "SLURM_PROCID", "SLURM_NTASKS is set");
  w.world_size = require_int(env, "SLURM_NTASKS", "SLURM_PROCID is set");
  w.local_rank = lookup_int(env, "SLURM_LOCALID").value_or(0);
  w.node_rank = lookup_int(env, "SLURM_NODEID").value_or(0);
  auto tasks = lookup(env, "SLURM_STEP_TASKS_PER_NODE");
  if (!tasks) tasks = lookup(env, "SLURM_TASKS_PER_NODE");
  if (tasks) {
    auto counts = slurm::expand_tasks_per_node(*tasks);
    w.num_nodes = static_cast<int>(counts.size());
    // A negative SLURM_NODEID would read before the start of the list.
    if (w.node_rank < 0 || w.node_rank >= w.num_nodes)
      throw ConfigError("SLURM_NODEID=" + std::to_string(w.node_rank) + " but the tasks-per-node list '" +
                        *tasks + "' names only " + std::to_string(w.num_nodes) + " nodes");
    w.local_world_size = counts[static_cast<size_t>(w.node_rank)];
  } else {
    w.num_nodes = lookup_int(env, "SLURM_NNODES").value_or(1);
    if (w.num_nodes < 1) throw ConfigError("SLURM_NNODES=" + std::to_string(w.num_nodes) + " must be >= 1");
    w.local_world_size = std::max(1, w.world_size / w.num_nodes);
  }
  w.local_world_size_given = true;
  w.run_id = lookup(env, "SLURM_JOB_ID").value_or("");
  if (w.world_size > 1) {
    if (auto addr = lookup(env, "MASTER_ADDR")) {
      w.master_addr = *addr;
    } else {
      auto list = lookup(env, "SLURM_STEP_NODELIST");
      if (!list) list = lookup(env, "SLURM_JOB_NODELIST");
      if (!list) list = lookup(env, "SLURM_NODELIST");
      if (!list)
        throw ConfigError("SLURM gives no node list (SLURM_JOB_NODELIST) and MASTER_ADDR is not set: "
                          "export MASTER_ADDR=<first node> before srun");
      auto hosts = slurm::expand_hostlist(*list);
      if (hosts.empty()) throw ConfigError("SLURM node list '" + *list + "' is empty");
      w.master_addr = hosts.front();
    }
    w.master_port = lookup_int(env, "MASTER_PORT").value_or(slurm_default_port(env));
  }
  validate(w, "SLURM");
  return w;
}

WorldInfo from_openmpi(const EnvMap& env) {
  WorldInfo w;
  w.source = WorldSource::kOpenMpi;
  w.rank = require_int(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE is set");
  w.world_size = require_int(env, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK is set");
  w.local_rank = lookup_int(env, "OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
  w.local_world_size = lookup_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(w.world_size);
  w.local_world_size_given = true;
  validate_sizes(w, "Open MPI");
  // Open MPI numbers ranks by slot, node after node, when mapping by slot (its default).
  w.node_rank = w.rank / w.local_world_size;
  w.num_nodes = (w.world_size + w.local_world_size - 1) / w.local_world_size;
  // Open MPI 4 names the job in OMPI_MCA_ess_base_jobid; Open MPI 5 (PRRTE) in
  // PMIX_NAMESPACE.
  w.run_id = lookup(env, "OMPI_MCA_ess_base_jobid").value_or(lookup(env, "PMIX_NAMESPACE").value_or(""));
  if (w.world_size > 1) {
    auto addr = lookup(env, "MASTER_ADDR");
    if (!addr && !w.single_node())
      throw ConfigError("mpirun across nodes needs MASTER_ADDR and MASTER_PORT: "
                        "mpirun -x MASTER_ADDR=<rank 0's host> -x MASTER_PORT=<free port> ...");
    w.master_addr = addr.value_or("127.0.0.1");
    auto port = lookup_int(env, "MASTER_PORT");
    if (!port) {
      if (w.run_id.empty())
        throw ConfigError("mpirun: MASTER_PORT is not set and Open MPI gives no job id to derive one from: "
                          "mpirun -x MASTER_PORT=<free port> ...");
      port = 15000 + static_cast<int>(std::hash<std::string>{}(w.run_id) % 20000);
    }
    w.master_port = *port;
  }
  validate(w, "Open MPI");
  return w;
}

}  // namespace

EnvMap process_environment() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

bool WorldInfo::all_on_this_host() const {
  if (world_size == 1) return true;
  bool loopback = master_addr == "localhost" || master_addr == "::1" || master_addr.rfind("127.", 0) == 0;
  return single_node() && (local_world_size_given || loopback);
}

const char* to_string(WorldSource source) {
  switch (source) {
    case WorldSource::kSingle: return "single process";
    case WorldSource::kTorchrun: return "torchrun/cohort run";
    case WorldSource::kSlurm: return "SLURM";
    case WorldSource::kOpenMpi: return "Open MPI";
  }
  return "unknown";
}

WorldInfo world_info_from(const EnvMap& env) {
  if (lookup(env, "RANK") || lookup(env, "WORLD_SIZE")) return from_torchrun(env);
  if (lookup(env, "SLURM_PROCID") && lookup(env, "SLURM_NTASKS")) return from_slurm(env);
  if (lookup(env, "OMPI_COMM_WORLD_RANK") || lookup(env, "OMPI_COMM_WORLD_SIZE")) return from_openmpi(env);
  return WorldInfo{};
}

}  // namespace cohort::comm
