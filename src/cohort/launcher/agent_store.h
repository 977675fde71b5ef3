#pragma once
// The elastic job's store as an agent sees it: the job's token, whether this agent
// hosts the store (its address is the endpoint's), and its client connection.
//
// Note [Who hosts the store]
// torchrun's rule: the agent on the host named by --rdzv-endpoint hosts the store.
// Several agents may run on that host (tests, or one agent per GPU group), so being
// on it is not enough: the first to bind the port hosts, and the others find the
// port taken and connect as clients. A port taken by anything but this job's store
// shows up when the handshake fails, and is reported against --rdzv-endpoint; one
// held without a listener is tried again for a while (Note [A port held without a
// listener] in agent_store.cpp). The
// server binds the endpoint's own address (loopback for --standalone), never every
// interface.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "cohort/comm/environment.h"
#include "cohort/compat/c10d.h"
#include "cohort/launcher/run_options.h"
#include "cohort/launcher/stock_worker_watch.h"
#include "cohort/store/etcd_options.h"
#include "cohort/store/store_client.h"
#include "cohort/store/store_server.h"

namespace cohort::launcher {

// --rdzv-token, else COHORT_RDZV_TOKEN; --standalone makes a fresh one. Throws
// UsageError when there is none, or one too short to resist guessing.
std::string resolve_token(const RunOptions& options, const comm::EnvMap& env);

// COHORT_STORE_TLS_CA, _CERT and _KEY: the site's certificates for every connection
// to the job's store, or none (docs/store_security.md). Throws UsageError when only
// some are set.
store::Certificates resolve_certificates(const comm::EnvMap& env);

// 64 hex digits from OpenSSL's CSPRNG: the token of a job that makes its own.
std::string fresh_token();

// Whether `host` names an address of this machine (loopback included).
bool is_local_host(const std::string& host);

struct AgentStore {
  std::unique_ptr<store::StoreServer> server;  // set when this agent hosts the store
  c10::intrusive_ptr<c10d::Store> client;
  // A connection of its own to the same store, with the client's timeout.
  std::function<c10::intrusive_ptr<c10d::Store>()> another;
  // Under --rdzv-backend etcd: the options of the job's etcd store (no agent hosts one).
  std::optional<store::EtcdStoreOptions> etcd;
  std::string host;  // as workers reach it (etcd: its first member, for messages)
  int port = 0;

  // Where the store is, for messages: "HOST:PORT", or "etcd at [members]".
  std::string where() const;
};

// Hosts the store (Note [Who hosts the store]) or connects to it, within `timeout`,
// calling `check` between short attempts (it may throw: the agent's signals).
// Throws UsageError for a port taken by something else or a refused token,
// TimeoutError when no store answers in time.
AgentStore open_agent_store(const RunOptions& options, const std::string& token,
                            const store::Certificates& certificates, std::chrono::milliseconds timeout,
                            const std::function<void()>& check, std::shared_ptr<StockWorkerWatch> watch = nullptr);

// Note [--rdzv-backend etcd]: the job's etcd store, under "cohort/<run id>/", once
// a member has answered a first request (within `timeout`, calling `check` between
// tries: etcd may come up after the agents, as on Kubernetes). The store then fails
// over between members for at most `failover` per request, so that an agent whose
// etcd lost its quorum says so (CommError naming etcd) within its heartbeat bound.
// Throws UsageError for options or credentials etcd refuses, CommError when no
// member answered in time.
AgentStore open_etcd_agent_store(const RunOptions& options, const comm::EnvMap& env, const std::string& run_id,
                                 std::chrono::milliseconds timeout, std::chrono::milliseconds failover,
                                 const std::function<void()>& check);

}  // namespace cohort::launcher
