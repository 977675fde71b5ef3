#include "cohort/launcher/stock_worker_watch.h"

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "cohort/launcher/port_holders.h"
#include "cohort/launcher/refusal_report.h"

namespace cohort::launcher {
namespace {

std::vector<pid_t> numeric_entries(const std::string& dir) {
  std::vector<pid_t> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (const dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long n = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && n > 0) out.push_back(static_cast<pid_t>(n));
  }
  ::closedir(d);
  return out;
}

// A process's parent, from /proc/<pid>/stat: the field after the state, which
// follows the command's closing parenthesis (the command may hold spaces).
std::optional<pid_t> parent_of(const std::string& proc, pid_t pid) {
  std::ifstream in(proc + "/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return std::nullopt;
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  char state = 0;
  long parent = 0;
  if (std::sscanf(stat.c_str() + close + 1, " %c %ld", &state, &parent) != 2) return std::nullopt;
  return static_cast<pid_t>(parent);
}

bool holds_socket(const std::string& proc, pid_t pid, std::uint64_t inode) {
  const std::string fds = proc + "/" + std::to_string(pid) + "/fd";
  const std::string wanted = fmt::format("socket:[{}]", inode);
  for (const pid_t fd : numeric_entries(fds)) {
    char target[64] = {};
    const auto n = ::readlink((fds + "/" + std::to_string(fd)).c_str(), target, sizeof target - 1);
    if (n > 0 && wanted == std::string(target, static_cast<std::size_t>(n))) return true;
  }
  return false;
}

}  // namespace

std::optional<pid_t> descendant_holding_socket(pid_t root, std::uint64_t inode, const std::string& proc) {
  std::multimap<pid_t, pid_t> children;
  for (const pid_t pid : numeric_entries(proc))
    if (const auto parent = parent_of(proc, pid)) children.emplace(*parent, pid);
  std::vector<pid_t> todo{root};
  while (!todo.empty()) {
    const pid_t parent = todo.back();
    todo.pop_back();
    const auto [first, last] = children.equal_range(parent);
    for (auto it = first; it != last; ++it) {
      if (holds_socket(proc, it->second, inode)) return it->second;
      todo.push_back(it->second);
    }
  }
  return std::nullopt;
}

StockWorkerWatch::StockWorkerWatch(pid_t launcher, std::chrono::milliseconds every)
    : launcher_(launcher), every_(every) {}

void StockWorkerWatch::refused(const std::string& line) {
  static const std::string kPrefix = "cohort store: refused ";
  const auto reason = line.find(": it does not speak TLS");
  if (line.rfind(kPrefix, 0) != 0 || reason == std::string::npos) return;
  const std::string peer = line.substr(kPrefix.size(), reason - kPrefix.size());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    if (sighting_ || now < next_lookup_) return;
    next_lookup_ = now + every_;
  }
  // A dual-stack client lists an IPv4 peer in tcp6, mapped.
  const std::string mapped = "[::ffff:" + peer.substr(0, peer.rfind(':')) + "]" + peer.substr(peer.rfind(':'));
  for (const auto& socket : tcp_sockets()) {
    if ((socket.local != peer && socket.local != mapped) || socket.inode == 0) continue;
    const auto pid = descendant_holding_socket(launcher_, socket.inode);
    if (!pid) continue;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!sighting_)
      sighting_ = fmt::format(
          "process {} of this job (a worker, or a process it started) reached the rendezvous store from {} with "
          "c10d's plain TCPStore protocol, which cohort's authenticated store refuses, so the job cannot run as "
          "started; it is stopped without a restart.\n  fix: {}",
          *pid, peer, kStockWorkerFix);
    return;
  }
}

std::optional<std::string> StockWorkerWatch::sighting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sighting_;
}

}  // namespace cohort::launcher
