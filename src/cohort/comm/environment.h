#pragma once
// Where the process world comes from. One binary works under `cohort run`,
// `torchrun --no-python`, `srun`, `mpirun`, and as a plain `./a.out`: this header
// reads whichever launcher's variables are present into one WorldInfo.
//
// Precedence (first match wins): torchrun/cohort variables (RANK, WORLD_SIZE), then
// SLURM (SLURM_PROCID, SLURM_NTASKS), then Open MPI (OMPI_COMM_WORLD_*), then a world
// of one that needs no network. The environment is read once, at the edge, into an
// EnvMap, so parsing is a pure function that tests call with any map they like.
#include <map>
#include <string>

#include "cohort/store/certificates.h"

namespace cohort::comm {

using EnvMap = std::map<std::string, std::string>;

// A copy of this process's environment.
EnvMap process_environment();

enum class WorldSource { kSingle, kTorchrun, kSlurm, kOpenMpi };
const char* to_string(WorldSource source);

struct WorldInfo {
  WorldSource source = WorldSource::kSingle;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;  // GROUP_RANK under torchrun
  int num_nodes = 1;
  // Empty when the world is one process that needs no rendezvous.
  std::string master_addr;
  int master_port = 0;
  // Set by a torchelastic-compatible agent: connect to its store as a client,
  // under the prefix "/worker/attempt_<restart_count>".
  bool use_agent_store = false;
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id;
  // Under cohort's elastic agent (COHORT_AGENT_STORE=cohort): its store speaks
  // cohort's authenticated protocol (store/store_client.h) with the job's token
  // (COHORT_RDZV_TOKEN), under the prefix COHORT_STORE_PREFIX, which names the
  // rendezvous round, so the store's one port serves every round.
  bool cohort_agent_store = false;
  std::string store_token;
  // COHORT_STORE_TLS_CA, _CERT and _KEY, inherited from the launcher's environment:
  // the site's certificates for that store, or none (docs/store_security.md).
  store::Certificates store_certificates;
  std::string store_prefix;

  // Whether the launcher said how many ranks share this host. A hand-written launch
  // that gives only RANK and WORLD_SIZE is assumed to be one host, but not trusted
  // with a loopback-only transport unless MASTER_ADDR is loopback too.
  bool local_world_size_given = false;

  bool single_node() const { return local_world_size == world_size; }
  // Every peer is known to be on this host: loopback is enough.
  bool all_on_this_host() const;
};

// Throws ConfigError naming the variable and the fix when the variables present are
// incomplete or inconsistent.
WorldInfo world_info_from(const EnvMap& env);

}  // namespace cohort::comm
