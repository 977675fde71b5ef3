#pragma once
// Note [Refusals in summary]: the store an agent hosts refuses strangers (a wrong
// token, another protocol, a handshake that never ends). A flood of them once gave
// 6,872 lines in 40 s, one per peer, printed on the store's only thread. Now the
// first few are printed as they come, so a misconfigured peer is named at once, and
// the rest are counted and printed as one summary line at most every interval, with
// the latest reason; what is still uncounted is printed when the store closes.
// Printing itself never blocks the store: the launcher's console is a ConsoleRelay
// (Note [Never stalled by the console]).
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace cohort::launcher {

class RefusalReport {
 public:
  using Clock = std::chrono::steady_clock;
  using Print = std::function<void(const std::string&)>;

  // `print` gets whole lines without the final newline.
  explicit RefusalReport(Print print, int print_first = 5, std::chrono::milliseconds every = std::chrono::seconds(10));
  // Prints the summary of what is still unreported.
  ~RefusalReport();
  RefusalReport(const RefusalReport&) = delete;
  RefusalReport& operator=(const RefusalReport&) = delete;

  // One refused peer, with the store's one-line reason (it names the peer).
  void refused(const std::string& reason, Clock::time_point now = Clock::now());
  std::int64_t total() const;

 private:
  void summarise(Clock::time_point now);
  mutable std::mutex mutex_;
  Print print_;
  int print_first_;
  std::chrono::milliseconds every_;
  std::int64_t total_ = 0;
  std::int64_t unreported_ = 0;
  std::string latest_;
  Clock::time_point since_{};  // the start of the unreported stretch
};

// A store's on_refused callback that reports to the launcher's stderr through a
// RefusalReport it owns (so the report outlives the store's thread and prints its
// last summary when the store closes). A peer that does not speak TLS (a stock c10d
// TCPStore client, or a port scan) also gets, once, kNotTlsHint. `watch`, where
// given, sees every refusal (Note [Telling a stock worker from a port scan]).
class StockWorkerWatch;
std::function<void(const std::string&)> refusals_to_stderr(std::shared_ptr<StockWorkerWatch> watch = nullptr);
extern const std::string kNotTlsHint;
// The ways to fix a worker that speaks c10d's plain TCPStore protocol, best first.
extern const char* const kStockWorkerFix;

}  // namespace cohort::launcher
