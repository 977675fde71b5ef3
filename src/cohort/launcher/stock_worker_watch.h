#pragma once
// Note [Telling a stock worker from a port scan]
// A peer that does not speak TLS to the launcher's store may be a port scan, or one
// of the job's own workers speaking c10d's plain TCPStore protocol (a stock
// init_process_group). PyTorch 2.x's client then retries for its whole init timeout
// (30 minutes), so the job would sit there after the launcher had named the fix.
// The launcher tells the two apart on the store's host: the refused peer's address
// is the local end of a socket in /proc/net/tcp, whose inode one of this launcher's
// own processes (a worker, or a process a worker started) holds open
// (/proc/<pid>/fd). Such a job cannot run as started, so the agent ends it at once,
// exit 2, without a restart. A peer held by no process of the launcher (a scan, a
// probe, another host) is only reported, as before. The lookup reads /proc, so it
// runs at most every `every` (a flood of scans costs the store little), and until
// the first sighting only. Only the node that hosts the store can see it.
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace cohort::launcher {

// The process among `root`'s descendants (not `root` itself) that holds the socket
// `inode` open, if any; read from `proc` (/proc).
std::optional<pid_t> descendant_holding_socket(pid_t root, std::uint64_t inode, const std::string& proc = "/proc");

class StockWorkerWatch {
 public:
  explicit StockWorkerWatch(pid_t launcher, std::chrono::milliseconds every = std::chrono::milliseconds(200));

  // A refusal line of the store ("cohort store: refused <a.b.c.d:port>: <reason>").
  // Called on the store's thread.
  void refused(const std::string& line);
  // The first sighting of a worker refused for not speaking TLS: what to tell the
  // user (who, and the fix). Empty until then.
  std::optional<std::string> sighting() const;

 private:
  pid_t launcher_;
  std::chrono::milliseconds every_;
  mutable std::mutex mutex_;
  std::optional<std::string> sighting_;
  std::chrono::steady_clock::time_point next_lookup_{};
};

}  // namespace cohort::launcher
