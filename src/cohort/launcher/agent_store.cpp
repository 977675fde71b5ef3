#include "cohort/launcher/agent_store.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "cohort/launcher/port_holders.h"
#include "cohort/launcher/refusal_report.h"
#include "cohort/store/tls.h"
#include "cohort/store/store_client.h"

namespace cohort::launcher {
namespace {

constexpr std::size_t kMinTokenLength = 16;
// A store of this job answers its handshake at once; this bounds the look at a port
// that something else holds.
constexpr auto kProbeTimeout = std::chrono::seconds(5);

}  // namespace

std::string fresh_token() {
  unsigned char raw[32];
  if (RAND_bytes(raw, sizeof raw) != 1) throw Error("cohort run: the system's random source failed");
  std::string hex;
  for (unsigned char c : raw) hex += fmt::format("{:02x}", c);
  return hex;
}

namespace {

// An IPv4 or IPv6 address as text; empty for any other family.
std::string address_text(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw = nullptr;
  if (addr->sa_family == AF_INET) raw = &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr;
  if (addr->sa_family == AF_INET6) raw = &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr;
  return raw && inet_ntop(addr->sa_family, raw, text, sizeof text) ? std::string(text) : std::string();
}

// The IPv4/IPv6 addresses `host` resolves to, as text.
std::set<std::string> addresses_of(const std::string& host) {
  std::set<std::string> out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (auto* a = res; a; a = a->ai_next) {
    auto text = address_text(a->ai_addr);
    if (!text.empty()) out.insert(text);
  }
  freeaddrinfo(res);
  return out;
}

std::set<std::string> local_addresses() {
  std::set<std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (auto* i = list; i; i = i->ifa_next) {
    auto text = i->ifa_addr ? address_text(i->ifa_addr) : std::string();
    if (!text.empty()) out.insert(text);
  }
  freeifaddrs(list);
  return out;
}

// The IPv4 address the server binds for `host` (our store listens on IPv4): one of
// this machine's, preferring one other hosts can reach.
std::string bind_address_for(const std::string& host) {
  const auto mine = local_addresses();
  std::string loopback;
  for (const auto& a : addresses_of(host)) {
    if (a.find(':') != std::string::npos) continue;
    if (a.rfind("127.", 0) == 0) {
      loopback = a;
    } else if (mine.count(a)) {
      return a;
    }
  }
  if (!loopback.empty()) return loopback;
  throw UsageError(fmt::format("--rdzv-endpoint {}: no IPv4 address of this machine for this host name; give an "
                               "IPv4 address",
                               host));
}

// Connects in short attempts until `timeout`, so that `check` sees the agent's
// signals while the hosting agent is still starting.
c10::intrusive_ptr<store::StoreClient> connect(const std::string& host, int port, const std::string& token,
                                               const store::Certificates& certificates,
                                               std::chrono::milliseconds timeout, const std::function<void()>& check) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      return c10::make_intrusive<store::StoreClient>(
          host, port, token, std::max(std::chrono::milliseconds(100), std::min(left, std::chrono::milliseconds(2000))),
          certificates);
    } catch (const TimeoutError& e) {
      if (left <= std::chrono::milliseconds(2000))
        throw TimeoutError(fmt::format("cohort run: no rendezvous store answered at {}:{} within {:.0f} s: {}\n  "
                                       "fix: start the agent on the --rdzv-endpoint host, and check the address, "
                                       "the port and the network; or raise --rdzv-conf join_timeout",
                                       host, port, std::chrono::duration<double>(timeout).count(), e.what()),
                           "connect to store", {});
    }
    check();
  }
}

// Note [A port held without a listener]
// Hosting fails (EADDRINUSE) while any socket holds the port, listening or not. Two
// agents of one job started together on one host may each find it held by the
// other's socket between that one's bind and its listen (stop 35's CI saw both fail
// so), and a connection may use it as its local port for a while. Only a listener
// can be this job's store, so while nothing listens there the agent tries to host
// again, after a random pause, for the probe's 5 s; then it names the sockets that
// hold the port (/proc/net/tcp). Returns null, with the reason in `error`, when a
// listener holds it: the caller's handshake tells whether it is this job's store.
std::unique_ptr<store::StoreServer> host_store(const std::string& bind, int port, const std::string& token,
                                               const store::Certificates& certificates,
                                               const std::function<void()>& check, std::string& error,
                                               const std::shared_ptr<StockWorkerWatch>& watch) {
  const auto deadline = std::chrono::steady_clock::now() + kProbeTimeout;
  std::mt19937 pick(std::random_device{}());
  std::uniform_int_distribution<int> pause_ms(20, 120);
  while (true) {
    try {
      return std::make_unique<store::StoreServer>(store::StoreServerOptions(token).bind_address(bind).port(port)
                                                      .on_refused(refusals_to_stderr(watch)).certificates(certificates));
    } catch (const UsageError&) {
      throw;
    } catch (const ConfigError& e) {
      error = e.what();
    }
    // Only a port in use can free itself; other refusals (privileged port, foreign
    // address) go to the caller's handshake and its messages at once.
    const bool in_use = error.find(std::strerror(EADDRINUSE)) != std::string::npos;
    if (!in_use || port == 0 || listener_at(bind, port)) return nullptr;
    if (std::chrono::steady_clock::now() >= deadline)
      throw UsageError(fmt::format("--rdzv-endpoint {}:{}: this agent could not host the store ({}), and for {:.0f} "
                                   "s nothing listened on the port while sockets held it:\n{}  fix: stop what "
                                   "holds the port, or pick a free port for --rdzv-endpoint, on every node",
                                   bind, port, error, std::chrono::duration<double>(kProbeTimeout).count(),
                                   port_holders(port)));
    check();
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms(pick)));
  }
}

// Every AgentStore of cohort's store can make another connection (found by test: a
// path that forgot it threw bad_function_call at the agent's first clone).
AgentStore with_another(AgentStore s) {
  auto* client = static_cast<store::StoreClient*>(s.client.get());
  s.another = [client] { return client->clone(); };
  return s;
}

UsageError refused(const RunOptions& o, const std::exception& e) {
  // A refusal over certificates (COHORT_STORE_TLS_*) names its own fix.
  const std::string why = e.what();
  if (why.find("COHORT_STORE_TLS_") != std::string::npos)
    return UsageError(fmt::format("--rdzv-endpoint {}: the store refused this agent, or this agent the store: {}",
                                  o.rdzv_endpoint, why));
  return UsageError(fmt::format("--rdzv-token: the store at {} refused this agent: {}\n  fix: give every node the "
                                "same token (COHORT_RDZV_TOKEN or --rdzv-token)",
                                o.rdzv_endpoint, why));
}

}  // namespace

std::string resolve_token(const RunOptions& options, const comm::EnvMap& env) {
  std::string token = options.rdzv_token;
  auto it = env.find("COHORT_RDZV_TOKEN");
  if (token.empty() && it != env.end()) token = it->second;
  if (token.empty() && options.standalone) token = fresh_token();
  if (token.empty())
    throw UsageError("--rdzv-token: the elastic rendezvous admits only agents that hold the job's shared secret; "
                     "set COHORT_RDZV_TOKEN on every node (e.g. `export COHORT_RDZV_TOKEN=$(openssl rand -hex 32)`, "
                     "shared as you share SSH keys), or pass --rdzv-token");
  if (token.size() < kMinTokenLength)
    throw UsageError(fmt::format("--rdzv-token: the token has {} characters; use at least {} random ones (e.g. "
                                 "`openssl rand -hex 32`) so that it cannot be guessed",
                                 token.size(), kMinTokenLength));
  // Every path returns this one variable (named return value, no std::string move):
  // with an inlined move, GCC 12 at -O1 warned (-Warray-bounds) about the move's
  // small-string branch, for a token known to hold at least kMinTokenLength characters.
  return token;
}

bool is_local_host(const std::string& host) {
  const auto mine = local_addresses();
  for (const auto& a : addresses_of(host))
    if (mine.count(a) || a.rfind("127.", 0) == 0 || a == "::1") return true;
  return false;
}

store::Certificates resolve_certificates(const comm::EnvMap& env) {
  try {
    auto certificates = store::certificates_from(env);
    // Loaded once here, so that a bad file is named before any port is tried.
    if (certificates.enabled()) store::tls::Context check(store::tls::Role::kServer, "check", certificates);
    return certificates;
  } catch (const ConfigError& e) {
    throw UsageError(e.what());
  }
}

AgentStore open_agent_store(const RunOptions& options, const std::string& token,
                            const store::Certificates& certificates, std::chrono::milliseconds timeout,
                            const std::function<void()>& check, std::shared_ptr<StockWorkerWatch> watch) {
  const auto endpoint = parse_endpoint(options.rdzv_endpoint, "--rdzv-endpoint");
  AgentStore s;
  s.host = endpoint.host;
  s.port = endpoint.port;
  std::string connect_to = endpoint.host;
  if (options.standalone || is_local_host(endpoint.host)) {
    const auto bind = options.standalone ? std::string("127.0.0.1") : bind_address_for(endpoint.host);
    connect_to = s.host = bind;
    std::string host_error;
    if (!(s.server = host_store(bind, endpoint.port, token, certificates, check, host_error, watch))) {
      // Taken: by another agent of this job on this host, we hope; the handshake tells.
      try {
        s.client = c10::make_intrusive<store::StoreClient>(s.host, s.port, token,
                                                           std::chrono::milliseconds(kProbeTimeout), certificates);
      } catch (const ConfigError& e) {
        throw refused(options, e);
      } catch (const TimeoutError& e) {
        // Say what happened: nothing proved it is someone else's, it just did not
        // answer in time ("not this job's store" is for a failed proof, below).
        throw UsageError(fmt::format("--rdzv-endpoint {}: this agent could not host the store ({}), and what holds "
                                     "port {} finished no handshake within {:.0f} s ({}): a program that accepts "
                                     "connections but does not answer, or a store too busy to.\n  fix: find what "
                                     "holds the port (`ss -ltnp`), or pick a free port for --rdzv-endpoint, on every "
                                     "node",
                                     options.rdzv_endpoint, host_error, s.port,
                                     std::chrono::duration<double>(kProbeTimeout).count(), e.what()));
      } catch (const std::exception& e) {
        throw UsageError(fmt::format("--rdzv-endpoint {}: this agent could not host the store ({}), and what holds "
                                     "port {} is not this job's store ({}).\n  fix: pick a free port for "
                                     "--rdzv-endpoint, on every node",
                                     options.rdzv_endpoint, host_error, s.port, e.what()));
      }
      return with_another(std::move(s));
    }
    s.port = s.server->port();
    if (options.max_nodes > 1 && connect_to.rfind("127.", 0) == 0)
      fmt::print(stderr, "cohort run: warning: --rdzv-endpoint {} resolves to {} on this host, a loopback address "
                         "that other hosts cannot reach; give this host's network address if nodes run elsewhere\n",
                 options.rdzv_endpoint, connect_to);
  }
  try {
    s.client = connect(connect_to, s.port, token, certificates, timeout, check);
  } catch (const ConfigError& e) {
    throw refused(options, e);
  }
  return with_another(std::move(s));
}

std::string AgentStore::where() const {
  if (!etcd) return fmt::format("{}:{}", host, port);
  return fmt::format("etcd at {}", fmt::join(etcd->endpoints(), ","));
}

AgentStore open_etcd_agent_store(const RunOptions& options, const comm::EnvMap& env, const std::string& run_id,
                                 std::chrono::milliseconds timeout, std::chrono::milliseconds failover,
                                 const std::function<void()>& check) {
  AgentStore s;
  try {
    s.etcd = store::etcd_options_for_run(options.rdzv_endpoint, run_id, etcd_conf(options), env);
  } catch (const UsageError&) {
    throw;
  } catch (const ConfigError& e) {
    throw UsageError(fmt::format("--rdzv-endpoint {}: {}", options.rdzv_endpoint, e.what()));
  }
  // Note [The first member that answers]: member by member, in short tries, watching
  // the signals; the one that answers goes first in the job's list, so that every
  // client made after (this agent's, its heartbeats', its workers') starts with a
  // member that serves rather than paying request_timeout on one that hangs.
  auto members = s.etcd->endpoints();
  const auto per_member = std::min<std::chrono::milliseconds>(
      {timeout, s.etcd->request_timeout(), std::chrono::milliseconds(2000)});
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> said(members.size());
  for (std::size_t m = 0;; m = (m + 1) % members.size()) {
    try {
      store::make_etcd_store(store::EtcdStoreOptions(*s.etcd)
                                 .endpoints({members[m]})
                                 .request_timeout(per_member)
                                 .failover_timeout(per_member))
          ->check({"job"});
      std::rotate(members.begin(), members.begin() + static_cast<std::ptrdiff_t>(m), members.end());
      s.etcd->endpoints(members);
      break;
    } catch (const CommError& e) {
      said[m] = e.what();
      if (std::chrono::steady_clock::now() >= deadline)
        throw CommError(fmt::format("cohort run: no member of the job's etcd ({}) answered within {:.0f} s:\n  "
                                    "{}\n  fix: check that etcd runs and that this host reaches it (`etcdctl "
                                    "--endpoints={} endpoint health`), or raise --rdzv-conf join_timeout",
                                    fmt::join(members, ","), std::chrono::duration<double>(timeout).count(),
                                    fmt::join(said, "\n  "), options.rdzv_endpoint));
    } catch (const ConfigError& e) {
      // etcd refused the credentials or TLS, or this build has no etcd store: each says so.
      throw UsageError(fmt::format("--rdzv-endpoint {}: {}", options.rdzv_endpoint, e.what()));
    }
    check();
  }
  s.etcd->failover_timeout(failover);
  s.client = store::make_etcd_store(*s.etcd);
  const auto etcd = *s.etcd;
  auto* client = s.client.get();
  s.another = [etcd, client] { return store::make_etcd_store(store::EtcdStoreOptions(etcd).timeout(client->getTimeout())); };
  // For messages only: workers reach etcd through COHORT_ETCD_ENDPOINTS.
  // (parse_etcd_endpoints checked every one, so this one parses.)
  const auto first = store::etcd_host_port(s.etcd->endpoints().front()).value_or(store::EtcdHostPort{});
  s.host = first.host;
  s.port = first.port;
  return s;
}

}  // namespace cohort::launcher
