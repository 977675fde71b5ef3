#pragma once
// Percentiles and medians for benchmarks/scale: what one timed phase measured, and
// the median of its repeats.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace cohort::bench {

// The q-quantile (0..1) of `samples`, nearest rank; 0 for no samples. Reorders them.
inline double percentile(std::vector<double>& samples, double q) {
  if (samples.empty()) return 0;
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(samples.size())));
  const std::size_t k = rank == 0 ? 0 : std::min(rank - 1, samples.size() - 1);
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(k), samples.end());
  return samples[k];
}

inline double median(std::vector<double> values) { return percentile(values, 0.5); }

// One timed phase: every client's operations together.
struct PhaseResult {
  double ops_per_s = 0;
  double p50_us = 0;
  double p99_us = 0;
  double server_cpu_us_per_op = 0;  // the server process's user + system time
  double server_sys_us_per_op = 0;  // of which in the kernel
  double client_cpu_us_per_op = 0;  // the clients' process's, all its threads
  // The fewest operations any client completed, over the mean: 1 when the server
  // serves every client alike, near 0 when it starves some.
  double fewest_share = 0;
};

// Each field's median over the repeats.
inline PhaseResult median_of(const std::vector<PhaseResult>& runs) {
  auto field = [&](double PhaseResult::*member) {
    std::vector<double> v;
    for (const auto& r : runs) v.push_back(r.*member);
    return median(std::move(v));
  };
  return {field(&PhaseResult::ops_per_s),
          field(&PhaseResult::p50_us),
          field(&PhaseResult::p99_us),
          field(&PhaseResult::server_cpu_us_per_op),
          field(&PhaseResult::server_sys_us_per_op),
          field(&PhaseResult::client_cpu_us_per_op),
          field(&PhaseResult::fewest_share)};
}

}  // namespace cohort::bench
