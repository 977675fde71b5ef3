#pragma once
// Where an EtcdStore (store/etcd_store.h) finds its etcd cluster and how it talks to
// it, in LibTorch's options idiom:
//
//   auto options = cohort::store::EtcdStoreOptions(
//                      cohort::store::parse_etcd_endpoints("10.0.0.1:2379,10.0.0.2:2379"))
//                      .prefix("cohort/" + run_id + "/")
//                      .user("trainer").password(secret);
#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include "cohort/compat/c10d.h"
#include "cohort/store/certificates.h"

namespace cohort::store {

struct EtcdStoreOptions {
  explicit EtcdStoreOptions(std::vector<std::string> endpoints) : endpoints_(std::move(endpoints)) {}
  // The cluster's client URLs, tried in turn: "host:port", or with a scheme,
  // "http://host:port" / "https://host:port". Without a scheme a member is reached
  // over https when `certificates` names a CA, over http otherwise. Give every
  // member: the store goes on through the others when one is lost.
  TORCH_ARG(std::vector<std::string>, endpoints);
  // Put before every key, so that jobs sharing a cluster stay apart (one per job or
  // run id, e.g. "cohort/<run id>/"). Must not be empty; getNumKeys() counts the
  // keys under it.
  TORCH_ARG(std::string, prefix) = "cohort/";
  // c10d's store timeout: how long get(), wait() and multiGet() wait for keys.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(5);
  // The longest one HTTP request to one member may take, connection included
  // (etcdctl's --command-timeout is 5 s too). A member that was sent a write just as
  // the leader died holds it until this runs out (etcd itself gives up after 7 s),
  // and then the next member is tried (Note [Members in turn]).
  TORCH_ARG(std::chrono::milliseconds, request_timeout) = std::chrono::seconds(5);
  // The longest a connection to one member may take to open: a member whose host
  // is down costs this much before the next one is tried.
  TORCH_ARG(std::chrono::milliseconds, connect_timeout) = std::chrono::seconds(2);
  // How long one operation keeps going round the members while none of them can
  // serve it (an election after the leader's loss takes about a second) before it
  // throws CommError (Note [Members in turn] in store/etcd_client_internal.h).
  TORCH_ARG(std::chrono::milliseconds, failover_timeout) = std::chrono::seconds(30);
  // etcd's own authentication (etcdctl auth enable). Empty user: none.
  TORCH_ARG(std::string, user);
  TORCH_ARG(std::string, password);
  // TLS: the CA that signed the members' certificates, and this client's
  // certificate and key where the cluster asks for one (--client-cert-auth).
  TORCH_ARG(Certificates, certificates);
};

// One member's address: "host:port" after an optional http:// or https:// and
// before optional trailing '/'s, the port in 1..65535; nullopt when it is not that.
struct EtcdHostPort {
  std::string host;
  int port = 0;
};
std::optional<EtcdHostPort> etcd_host_port(const std::string& endpoint);

// Splits torchrun's --rdzv-endpoint list ("host:port,host:port"); throws ConfigError
// naming the entry that is not host:port (with an optional http:// or https://).
std::vector<std::string> parse_etcd_endpoints(const std::string& list);

// The environment's variable that holds the etcd password for etcd_options_for_run
// (kept off command lines, which other users of the host can read).
inline constexpr char kEtcdPasswordVariable[] = "COHORT_ETCD_PASSWORD";

// The options of a job's stores under `cohort run --rdzv-backend etcd`:
// --rdzv-endpoint's list, the prefix "cohort/<run id>/", and these --rdzv-conf
// keys where `conf` has them: torchrun's etcd keys `protocol` (http or https),
// `cacert`, `cert` and `key` (files; relative paths are made absolute), and `user`,
// whose password comes from env's COHORT_ETCD_PASSWORD. Other keys are the
// caller's. Throws ConfigError naming the key or value that cannot work.
EtcdStoreOptions etcd_options_for_run(const std::string& endpoints, const std::string& run_id,
                                      const std::map<std::string, std::string>& conf,
                                      const std::map<std::string, std::string>& env);

// Throws ConfigError, naming the option and the fix, when `options` cannot work.
void validate(const EtcdStoreOptions& options);

// The --rdzv-conf keys etcd_options_for_run reads (torchrun's etcd keys and `user`).
const std::set<std::string>& etcd_conf_keys();

// Note [Workers find etcd through their environment]
// Under `cohort run --rdzv-backend etcd` the workers' store is the job's etcd too
// (no agent hosts one), so an agent tells its workers how to reach it: these
// variables (COHORT_AGENT_STORE=etcd, COHORT_ETCD_ENDPOINTS, COHORT_ETCD_CONF: the
// etcd keys of --rdzv-conf), with TORCHELASTIC_RUN_ID for the prefix and the
// password, if any, in COHORT_ETCD_PASSWORD, which the workers inherit. A worker
// builds the same options the agent did from them, so both share one prefix.
std::map<std::string, std::string> etcd_worker_variables(const std::string& endpoints,
                                                         const std::map<std::string, std::string>& conf);
// The options a worker's environment names (etcd_worker_variables, above); throws
// ConfigError naming the variable that is missing or wrong.
EtcdStoreOptions etcd_options_from_worker_env(const std::map<std::string, std::string>& env);

// An EtcdStore (store/etcd_store.h) over `options`. Throws ConfigError saying so when
// this build of cohort has no etcd store (COHORT_WITH_ETCD=OFF: no libcurl).
c10::intrusive_ptr<c10d::Store> make_etcd_store(const EtcdStoreOptions& options);

// Deletes every key under options.prefix() (a job's keys once it is over); returns
// how many there were. Throws as make_etcd_store does, and CommError when no
// member answers.
std::int64_t delete_etcd_prefix(const EtcdStoreOptions& options);

// The same, in one etcd transaction, only while `key` (under the prefix) still holds
// `value`: a job's record is cleared only as it was read. Returns whether it was.
bool delete_etcd_prefix_if(const EtcdStoreOptions& options, const std::string& key,
                           const std::vector<std::uint8_t>& value);

}  // namespace cohort::store
