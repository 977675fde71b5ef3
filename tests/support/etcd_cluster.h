#pragma once
// A real etcd cluster on loopback for tests: `members` etcd processes on free ports,
// each with a data directory of its own, killed (SIGKILL, then reaped) when the
// cluster goes. Needs Debian's etcd-server and etcd-client (scripts/install-deps):
// without them the constructor throws, so a test fails saying so rather than
// passing untested.
//
//   cohort::testing::EtcdCluster cluster(3);
//   auto store = c10::make_intrusive<cohort::store::EtcdStore>(
//       cohort::store::EtcdStoreOptions(cluster.endpoints()).prefix("test/"));
//   cluster.kill(0);  // the store goes on through the other two
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cohort/store/certificates.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace cohort::testing {

struct EtcdClusterOptions {
  int members = 3;
  // Given to every member (--cert-file, --client-cert-auth, ... for TLS).
  std::vector<std::string> extra_flags;
  // With a CA: the members' client URLs are https:// (extra_flags must then give
  // them their certificates), and the readiness probe and etcdctl use these.
  store::Certificates tls_client;
};

class EtcdCluster {
 public:
  // Starts the members and returns once each of them serves a linearizable read
  // (within 60 s; a start that loses a port to another process is retried on new
  // ports). Throws std::runtime_error, with the members' logs, when it cannot.
  explicit EtcdCluster(EtcdClusterOptions options = {});
  explicit EtcdCluster(int members) : EtcdCluster(EtcdClusterOptions{members, {}, {}}) {}
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // "127.0.0.1:<port>" of each member's client URL, in member order (https://... with TLS).
  std::vector<std::string> endpoints() const;
  // The same, comma-separated, as --rdzv-endpoint takes them.
  std::string endpoint_list() const;
  // The member that is the raft leader now (etcdctl endpoint status), -1 when none
  // of the running members says it is.
  int leader() const;
  // SIGKILL the member and reap it.
  void kill(int member);
  // SIGSTOP the member: it keeps its sockets and answers nothing, as a hung host.
  // etcdctl() then waits on it; the cluster's end kills it as any other.
  void hang(int member);
  // Runs etcdctl (API v3) against every member still running; returns its result.
  ProcessResult etcdctl(const std::vector<std::string>& args) const;
  // What the members logged so far, for a failing test's message.
  std::string logs() const;

  // The etcd and etcdctl programs, searched in PATH and /usr/bin; throws
  // std::runtime_error saying to run scripts/install-deps when missing.
  static std::string program(const std::string& name);

 private:
  bool start(std::chrono::steady_clock::time_point deadline);
  bool tls() const { return !options_.tls_client.ca_file.empty(); }
  void stop_all();

  EtcdClusterOptions options_;
  TempDir dir_{"cohort-etcd"};
  std::vector<int> client_ports_;
  std::vector<std::unique_ptr<Subprocess>> members_;
  int attempt_ = 0;
};

}  // namespace cohort::testing
