#include "cohort/launcher/static_rendezvous.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cohort/comm/rendezvous.h"
#include "cohort/errors.h"
#include "cohort/elastic/rendezvous_state.h"
#include "cohort/launcher/agent_store.h"
#include "cohort/launcher/refusal_report.h"
#include "cohort/launcher/signal_pipe.h"
#include "cohort/launcher/worker_store.h"
#include "cohort/store/store_client.h"
#include "cohort/util/bytes.h"

namespace cohort::launcher {
namespace {

// Waits for `keys`, naming the nodes whose key is missing when time runs out.
void wait_for_nodes(c10d::Store& store, const std::string& what, int nodes, std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int n = 0; n < nodes; ++n) keys.push_back(fmt::format("cohort/static/{}/{}", what, n));
  auto absent = comm::wait_for_keys(store, keys, timeout, "node 0's launcher");
  if (absent.empty()) return;
  std::vector<int> missing(absent.begin(), absent.end());  // key n belongs to node n
  throw TimeoutError(fmt::format("cohort run: waited {:.0f} s for every node to {}; missing node rank(s): {}.\n"
                                 "  fix: start `cohort run` on those nodes with the same --nnodes, --master-addr and "
                                 "--master-port, or raise --join-timeout",
                                 std::chrono::duration<double>(timeout).count(),
                                 what == "size" ? "join" : "finish", fmt::join(missing, ", ")),
                     "static rendezvous", missing);
}

}  // namespace

Assignment assign_ranks(const std::vector<int>& local_world_sizes, int node_rank) {
  Assignment a;
  a.group_rank = node_rank;
  a.group_world_size = static_cast<int>(local_world_sizes.size());
  a.world_size = 0;
  for (int n = 0; n < a.group_world_size; ++n) {
    if (n < node_rank) a.base_rank += local_world_sizes[static_cast<size_t>(n)];
    a.world_size += local_world_sizes[static_cast<size_t>(n)];
  }
  return a;
}

void check_port_free(int port) {
  if (port == 0) return;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  int rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  int err = errno;
  ::close(fd);
  if (rc != 0 && err == EADDRINUSE)
    throw UsageError(fmt::format("--master-port {}: the port is already in use on this host (another job?); pick "
                                 "another, or pass --master-port 0 for a free one",
                                 port));
}

StaticRendezvous::StaticRendezvous(const RunOptions& options, std::chrono::milliseconds timeout,
                                   store::Certificates certificates, std::shared_ptr<StockWorkerWatch> watch)
    : options_(options),
      timeout_(timeout),
      certificates_(std::move(certificates)),
      watch_(std::move(watch)),
      address_(options.master_addr),
      port_(options.master_port) {
  if (options.max_nodes == 1 && worker_store_of(options) == elastic::WorkerStore::kCohort) {
    host_authenticated_store();
    return;
  }
  const bool host = options.node_rank == 0;
  if (host) check_port_free(port_);
  c10::intrusive_ptr<c10d::TCPStore> tcp;
  try {
    tcp = compat::make_tcp_store(address_, static_cast<uint16_t>(port_), host, timeout_);
  } catch (const std::exception& e) {
    if (host)
      throw UsageError(fmt::format("--master-port {}: could not host the rendezvous store: {}\n  pick another port, "
                                   "or pass --master-port 0",
                                   port_, e.what()));
    throw TimeoutError(fmt::format("cohort run: node {} could not reach node 0's store at {}:{} within {:.0f} s: {}\n"
                                   "  fix: start node 0 first or together, and check --master-addr/--master-port and "
                                   "the network between the nodes",
                                   options.node_rank, address_, port_,
                                   std::chrono::duration<double>(timeout_).count(), e.what()),
                       "static rendezvous", {0});
  }
  port_ = tcp->getPort();
  store_ = tcp;
  if (options.max_nodes == 1) fmt::print(stderr, "{}\n", tcpstore_warning(port_));
}

// Note [The workers' store]: one node, so loopback, and a token of its own.
void StaticRendezvous::host_authenticated_store() {
  address_ = "127.0.0.1";
  token_ = fresh_token();
  try {
    server_ = std::make_unique<store::StoreServer>(
        store::StoreServerOptions(token_).bind_address(address_).port(port_).on_refused(refusals_to_stderr(watch_))
            .certificates(certificates_));
  } catch (const ConfigError& e) {
    throw UsageError(fmt::format("--master-port {}: could not host the workers' store: {}\n  pick another port, or "
                                 "pass --master-port 0",
                                 port_, e.what()));
  }
  port_ = server_->port();
  store_ = c10::make_intrusive<store::StoreClient>(address_, port_, token_, timeout_, certificates_);
}

comm::EnvMap StaticRendezvous::worker_variables(int attempt) const {
  if (!server_) return {};
  return {{"COHORT_AGENT_STORE", "cohort"}, {"COHORT_RDZV_TOKEN", token_}, {"COHORT_STORE_PREFIX", worker_prefix(attempt)}};
}

std::string StaticRendezvous::worker_prefix(int attempt) const {
  return server_ ? fmt::format("/cohort/static/attempt_{}/worker", attempt) : fmt::format("/worker/attempt_{}", attempt);
}

c10::intrusive_ptr<c10d::Store> StaticRendezvous::workers_view(int attempt, std::chrono::milliseconds timeout) const {
  c10::intrusive_ptr<c10d::Store> client;
  if (server_)
    client = c10::make_intrusive<store::StoreClient>(address_, port_, token_, timeout, certificates_);
  else
    client = compat::make_tcp_store(address_, static_cast<std::uint16_t>(port_), false, timeout);
  client->setTimeout(timeout);
  return c10::make_intrusive<c10d::PrefixStore>(worker_prefix(attempt), std::move(client));
}

Assignment StaticRendezvous::assign(int local_world_size) {
  const int nodes = options_.max_nodes;
  // Nodes that disagree on --nnodes would form overlapping worlds and hang.
  if (options_.node_rank == 0) store_->set("cohort/static/nnodes", util::to_bytes(std::to_string(nodes)));
  store_->wait({"cohort/static/nnodes"}, timeout_);
  auto raw_nodes = store_->get("cohort/static/nnodes");
  auto theirs = util::from_bytes(raw_nodes);
  if (theirs != std::to_string(nodes))
    throw UsageError(fmt::format("--nnodes {}: node 0 runs with --nnodes {}; every node must pass the same value",
                                 nodes, theirs));
  store_->set(fmt::format("cohort/static/size/{}", options_.node_rank), util::to_bytes(std::to_string(local_world_size)));
  wait_for_nodes(*store_, "size", nodes, timeout_);
  std::vector<int> sizes;
  for (int n = 0; n < nodes; ++n) {
    auto raw = store_->get(fmt::format("cohort/static/size/{}", n));
    sizes.push_back(std::stoi(util::from_bytes(raw)));
  }
  node_sizes_ = sizes;
  return assign_ranks(sizes, options_.node_rank);
}

// Note [Static exit barrier]
// Node 0's store must outlive every worker of the job (a worker may reach it until
// it exits), so node 0's agent waits for every node's "done" key before it exits,
// and the other agents post theirs once their workers are gone. The wait is bounded
// by --join-timeout and ends early on SIGINT, SIGTERM or SIGHUP. The launcher's
// self-pipe also carries a byte per SIGCHLD, and the last worker's is usually still
// unread here: such bytes are drained and ignored, never taken for a stop request.
int StaticRendezvous::finish(int signal_fd) {
  if (options_.max_nodes == 1) return 0;
  try {
    store_->set(fmt::format("cohort/static/done/{}", options_.node_rank), util::to_bytes("1"));
    if (options_.node_rank != 0) return 0;
    std::vector<std::string> keys;
    for (int n = 0; n < options_.max_nodes; ++n) keys.push_back(fmt::format("cohort/static/done/{}", n));
    if (store_->check(keys)) return 0;
    fmt::print(stderr, "cohort run: this node's workers are done; node 0 hosts the store, so it waits up to {:.0f} s "
                       "for the other nodes' workers to finish\n",
               std::chrono::duration<double>(timeout_).count());
    // Polled rather than store->wait(), so that a signal to the launcher is seen.
    auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (!store_->check(keys)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        fmt::print(stderr, "cohort run: gave up after {:.0f} s waiting for the other nodes to finish; their workers "
                           "lose the store now\n",
                   std::chrono::duration<double>(timeout_).count());
        return 0;
      }
      pollfd p{signal_fd, POLLIN, 0};
      if (poll(&p, 1, 200) > 0)
        if (int sig = pending_signal(signal_fd)) return sig;  // the user wants out
    }
  } catch (const std::exception& e) {
    // The job's outcome is already decided; report and move on.
    fmt::print(stderr, "cohort run: while waiting for the other nodes to finish: {}\n", e.what());
  }
  return 0;
}

}  // namespace cohort::launcher
