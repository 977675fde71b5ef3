#pragma once
// Step times of one rank, kept for the straggler report (trace/straggler.h). Pure.
//
//   cohort::trace::StepTimes times;
//   auto t0 = std::chrono::steady_clock::now();
//   ... one step ...
//   times.add(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
#include <cstddef>
#include <cstdint>
#include <vector>

namespace cohort::trace {

struct StepSummary {
  std::int64_t count = 0;
  double median_s = 0;
  double p90_s = 0;
};

// Median and 90th percentile (nearest rank) of `seconds`; zeros when empty.
StepSummary summarize(std::vector<double> seconds);

class StepTimes {
 public:
  void add(double seconds) { seconds_.push_back(seconds); }
  std::size_t size() const { return seconds_.size(); }
  // The steps from index `first` on (0: the whole run).
  StepSummary summary(std::size_t first = 0) const;

 private:
  std::vector<double> seconds_;
};

}  // namespace cohort::trace
