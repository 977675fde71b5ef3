#include "support/etcd_cluster.h"

#include <signal.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "cohort/errors.h"
#include "cohort/store/etcd_store.h"

namespace cohort::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

}  // namespace

std::string EtcdCluster::program(const std::string& name) {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream in(path);
    for (std::string d; std::getline(in, d, ':');) dirs.push_back(d);
  }
  dirs.push_back("/usr/bin");
  for (const auto& d : dirs) {
    const auto candidate = d + "/" + name;
    if (!d.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  throw std::runtime_error("the etcd store's tests need a real etcd, and '" + name +
                           "' is not installed\n  fix: run scripts/install-deps (Debian's etcd-server and etcd-client)");
}

EtcdCluster::EtcdCluster(EtcdClusterOptions options) : options_(std::move(options)) {
  program("etcd");
  program("etcdctl");
  const auto deadline = Clock::now() + 60s;
  for (int tries = 0; tries < 3; ++tries) {
    if (start(deadline)) return;
    auto why = logs();
    stop_all();
    if (Clock::now() >= deadline || tries == 2)
      throw std::runtime_error("EtcdCluster: the etcd members did not come up; their logs:\n" + why);
  }
}

EtcdCluster::~EtcdCluster() { stop_all(); }

void EtcdCluster::stop_all() {
  // Subprocess's destructor kills the process group with SIGKILL and reaps it.
  members_.clear();
}

bool EtcdCluster::start(Clock::time_point deadline) {
  ++attempt_;
  const int n = options_.members;
  client_ports_.clear();
  std::vector<int> peer_ports;
  for (int i = 0; i < n; ++i) {
    client_ports_.push_back(free_port());
    peer_ports.push_back(free_port());
  }
  const std::string scheme = tls() ? "https://" : "http://";
  std::vector<std::string> initial;
  for (int i = 0; i < n; ++i)
    initial.push_back("m" + std::to_string(i) + "=http://127.0.0.1:" + std::to_string(peer_ports[i]));
  for (int i = 0; i < n; ++i) {
    const auto name = "m" + std::to_string(i);
    const auto data = dir_.path + "/" + std::to_string(attempt_) + "-" + name;
    std::filesystem::create_directories(data);
    const auto client = scheme + "127.0.0.1:" + std::to_string(client_ports_[i]);
    const auto peer = "http://127.0.0.1:" + std::to_string(peer_ports[i]);
    std::vector<std::string> argv{program("etcd"),
                                  "--name=" + name,
                                  "--data-dir=" + data,
                                  "--listen-client-urls=" + client,
                                  "--advertise-client-urls=" + client,
                                  "--listen-peer-urls=" + peer,
                                  "--initial-advertise-peer-urls=" + peer,
                                  "--initial-cluster=" + join(initial, ","),
                                  "--initial-cluster-state=new",
                                  "--initial-cluster-token=cohort-test-" + std::to_string(::getpid()),
                                  // A file of its own, so that a pipe nobody reads never stalls a member.
                                  "--logger=zap",
                                  "--log-outputs=" + data + ".log"};
    argv.insert(argv.end(), options_.extra_flags.begin(), options_.extra_flags.end());
    members_.push_back(std::make_unique<Subprocess>(argv));
  }
  // Ready when every member serves a linearizable read (so it has a leader), each
  // asked on its own; a member that exits (its port taken) fails this start.
  for (int i = 0; i < n; ++i) {
    auto probe = store::EtcdStore(store::EtcdStoreOptions({scheme + "127.0.0.1:" + std::to_string(client_ports_[i])})
                                      .prefix("cohort-test-probe/")
                                      .certificates(options_.tls_client)
                                      .request_timeout(1s)
                                      .failover_timeout(1s));
    while (true) {
      if (process_gone(members_[i]->pid())) return false;
      if (Clock::now() >= deadline) return false;
      try {
        probe.check({"ready"});
        break;
      } catch (const cohort::CommError&) {
        // Not serving yet: the probe's own failover waited, bounded, before giving up.
      }
    }
  }
  return true;
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (int p : client_ports_) out.push_back((tls() ? "https://127.0.0.1:" : "127.0.0.1:") + std::to_string(p));
  return out;
}

std::string EtcdCluster::endpoint_list() const { return join(endpoints(), ","); }

int EtcdCluster::leader() const {
  // One line per member: "ENDPOINT, ID, VERSION, DB SIZE, IS LEADER, IS LEARNER, ...".
  const auto status = etcdctl({"endpoint", "status"});
  std::stringstream lines(status.out);
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> fields;
    std::stringstream in(line);
    for (std::string f; std::getline(in, f, ',');) {
      const auto start = f.find_first_not_of(' ');
      fields.push_back(start == std::string::npos ? "" : f.substr(start));
    }
    if (fields.size() < 5 || fields[4] != "true") continue;
    for (std::size_t i = 0; i < client_ports_.size(); ++i)
      if (fields[0].size() >= std::to_string(client_ports_[i]).size() + 1 &&
          fields[0].compare(fields[0].size() - std::to_string(client_ports_[i]).size() - 1, std::string::npos,
                            ":" + std::to_string(client_ports_[i])) == 0)
        return static_cast<int>(i);
  }
  return -1;
}

void EtcdCluster::kill(int member) { members_.at(member).reset(); }

void EtcdCluster::hang(int member) { ::kill(members_.at(member)->pid(), SIGSTOP); }

ProcessResult EtcdCluster::etcdctl(const std::vector<std::string>& args) const {
  std::vector<std::string> live;
  for (std::size_t i = 0; i < members_.size(); ++i)
    if (members_[i]) live.push_back((tls() ? "https://127.0.0.1:" : "http://127.0.0.1:") +
                                    std::to_string(client_ports_[i]));
  std::vector<std::string> argv{program("etcdctl"), "--endpoints=" + join(live, ",")};
  const auto& c = options_.tls_client;
  if (!c.ca_file.empty()) argv.push_back("--cacert=" + c.ca_file);
  if (!c.cert_file.empty()) argv.push_back("--cert=" + c.cert_file);
  if (!c.key_file.empty()) argv.push_back("--key=" + c.key_file);
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, 30s, {{"ETCDCTL_API", "3"}});
}

std::string EtcdCluster::logs() const {
  std::string out;
  for (std::size_t i = 0; i < client_ports_.size(); ++i) {
    const auto path = dir_.path + "/" + std::to_string(attempt_) + "-m" + std::to_string(i) + ".log";
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    auto s = text.str();
    if (s.size() > 4000) s = "..." + s.substr(s.size() - 4000);
    out += "--- member " + std::to_string(i) + " (" + path + ")\n" + s;
  }
  return out;
}

}  // namespace cohort::testing
