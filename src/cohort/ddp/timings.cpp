#include "cohort/ddp/timings.h"

#include <algorithm>

namespace cohort::ddp {

double IterationTimings::hidden_fraction() const {
  double start = -1, end = -1;
  for (const auto& b : buckets) {
    if (b.launched_s >= 0 && (start < 0 || b.launched_s < start)) start = b.launched_s;
    end = std::max(end, b.done_s);
  }
  if (start < 0 || end <= start) return 1.0;
  return std::clamp((std::min(end, backward_end_s) - start) / (end - start), 0.0, 1.0);
}

}  // namespace cohort::ddp
