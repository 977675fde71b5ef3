#include "cohort/launcher/refusal_report.h"

#include "cohort/launcher/stock_worker_watch.h"

#include <atomic>
#include <memory>

#include <fmt/format.h>

namespace cohort::launcher {

RefusalReport::RefusalReport(Print print, int print_first, std::chrono::milliseconds every)
    : print_(std::move(print)), print_first_(print_first), every_(every) {}

RefusalReport::~RefusalReport() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (unreported_ > 0) summarise(Clock::now());
}

void RefusalReport::refused(const std::string& reason, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++total_;
  if (total_ <= print_first_) {
    print_("cohort run: refused a connection to the rendezvous store: " + reason);
    if (total_ == print_first_)
      print_(fmt::format("cohort run: further refusals are counted and summarised at most every {:.0f} s",
                         std::chrono::duration<double>(every_).count()));
    since_ = now;
    return;
  }
  if (unreported_ == 0) since_ = now;
  ++unreported_;
  latest_ = reason;
  if (now - since_ >= every_) summarise(now);
}

void RefusalReport::summarise(Clock::time_point now) {
  print_(fmt::format("cohort run: refused {} more connection{} to the rendezvous store in the last {:.0f} s ({} in all); the "
                     "latest: {}",
                     unreported_, unreported_ == 1 ? "" : "s",
                     std::chrono::duration<double>(now - since_).count(), total_, latest_));
  unreported_ = 0;
  since_ = now;
}

std::int64_t RefusalReport::total() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return total_;
}

// Note [Not TLS is not a diagnosis]: a peer that does not speak TLS is as often a
// port scan or a health probe (harmless: it is closed without a byte) as a stock
// c10d worker. The hint says so, and lists the authenticated ways first: the
// unauthenticated TCPStore is the last resort, not *the* fix.
const char* const kStockWorkerFix =
    "best first: (1) have the worker join through cohort::comm::World::init(), which reads "
    "COHORT_AGENT_STORE and COHORT_RDZV_TOKEN and speaks the authenticated store; (2) a LibTorch "
    "program that makes its own store can use cohort::store::StoreClient with COHORT_RDZV_TOKEN (and "
    "COHORT_STORE_TLS_* where set); (3) only for workers that must stay stock c10d (Python's "
    "init_process_group): --rdzv-conf worker_store=tcpstore, a plain TCPStore that is unauthenticated like "
    "torchrun's, on a network you trust (docs/store_security.md)";
// kStockWorkerFix is constant-initialised, so it is there before this is built.
const std::string kNotTlsHint = std::string(
    "cohort run: note: a peer that does not speak TLS reached the rendezvous store. A port scan or health probe "
    "is harmless (it was closed without a byte). If it was one of the job's workers speaking c10d's own TCPStore "
    "protocol, fix it, ") + kStockWorkerFix;

std::function<void(const std::string&)> refusals_to_stderr(std::shared_ptr<StockWorkerWatch> watch) {
  auto print = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
  auto report = std::make_shared<RefusalReport>(print);
  auto hinted = std::make_shared<std::atomic<bool>>(false);
  return [report, hinted, print, watch](const std::string& why) {
    report->refused(why);
    if (why.find("TCPStore client") != std::string::npos && !hinted->exchange(true)) print(kNotTlsHint);
    if (watch) watch->refused(why);
  };
}

}  // namespace cohort::launcher
