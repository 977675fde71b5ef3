#include "cohort/trace/step_stats.h"

#include <algorithm>
#include <cmath>

namespace cohort::trace {

StepSummary summarize(std::vector<double> seconds) {
  StepSummary s;
  s.count = static_cast<std::int64_t>(seconds.size());
  if (seconds.empty()) return s;
  std::sort(seconds.begin(), seconds.end());
  const std::size_t n = seconds.size();
  s.median_s = n % 2 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2;
  const auto rank90 = static_cast<std::size_t>(std::ceil(0.9 * static_cast<double>(n)));
  s.p90_s = seconds[std::max<std::size_t>(rank90, 1) - 1];
  return s;
}

StepSummary StepTimes::summary(std::size_t first) const {
  if (first >= seconds_.size()) return {};
  return summarize(std::vector<double>(seconds_.begin() + static_cast<std::ptrdiff_t>(first), seconds_.end()));
}

}  // namespace cohort::trace
