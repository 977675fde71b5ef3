#pragma once
// The trainer's checkpoints: the checkpointer's options from its flags
// (--keep-checkpoints, --checkpoint-async, --checkpoint-when-busy), the same for
// every strategy, and what the final JSON line says of them.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cohort/checkpoint/checkpointer.h"
#include "options.h"

namespace fashion_mnist {

inline cohort::checkpoint::CheckpointerOptions checkpointer_options(const TrainerOptions& o) {
  return cohort::checkpoint::CheckpointerOptions()
      .keep_last(o.keep_checkpoints)
      .asynchronous(o.checkpoint_async)
      .format(o.checkpoint_format == "dcp" ? cohort::checkpoint::Format::kDcp : cohort::checkpoint::Format::kCohort)
      .when_busy(o.checkpoint_when_busy == "skip" ? cohort::checkpoint::WhenBusy::kSkip
                                                  : cohort::checkpoint::WhenBusy::kWait);
}

// How long each save held this rank's training loop, and rank 0's log line for an
// asynchronous write that failed (the next save or the final wait raises it).
class CheckpointLog {
 public:
  template <class Save>
  void timed(Save&& save) {
    const auto begin = std::chrono::steady_clock::now();
    save();
    blocked_s_.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
  }

  void report_failure(const cohort::checkpoint::Checkpointer& checkpointer, bool lead) {
    if (!lead) return;
    auto failure = checkpointer.write_failure();
    if (failure && failure != reported_) {
      std::cerr << "cohort: warning: " << *failure << "; the next checkpoint raises it" << std::endl;
      reported_ = failure;
    }
  }

  nlohmann::json summary(const cohort::checkpoint::Checkpointer& checkpointer, bool asynchronous) const {
    auto sorted = blocked_s_;
    std::sort(sorted.begin(), sorted.end());
    double total = 0;
    for (double s : sorted) total += s;
    const auto stats = checkpointer.async_stats();
    return {{"async", asynchronous},
            {"saves", sorted.size()},
            {"skipped", stats.skipped},
            {"blocked_s", total},
            {"blocked_ms_median", sorted.empty() ? 0.0 : 1e3 * sorted[sorted.size() / 2]},
            {"blocked_ms_max", sorted.empty() ? 0.0 : 1e3 * sorted.back()},
            {"host_bytes", stats.host_bytes},
            {"writer_cpu_s", stats.writer_cpu_s}};
  }

 private:
  std::vector<double> blocked_s_;
  std::optional<std::string> reported_;
};

}  // namespace fashion_mnist
