#include "cohort/trace/straggler.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <limits>

#include "cohort/errors.h"

namespace cohort::trace {

std::vector<int> StragglerReport::stragglers() const {
  std::vector<int> out;
  for (const auto& r : ranks)
    if (r.straggler) out.push_back(r.rank);
  return out;
}

std::string StragglerReport::format(const std::string& title) const {
  std::string out = fmt::format("{}\n  rank  steps  median ms  p90 ms  score\n", title);
  for (const auto& r : ranks) {
    out += fmt::format("  {:>4}  {:>5}  {:>9.2f}  {:>6.2f}  {:>5.2f}{}\n", r.rank, r.steps.count, r.steps.median_s * 1e3,
                       r.steps.p90_s * 1e3, r.score, r.straggler ? "  straggler" : "");
  }
  const auto slow = stragglers();
  if (slow.empty()) {
    out += fmt::format("  no straggler: every rank within {:.0f}% of the fastest\n", threshold * 100);
  } else {
    std::string names;
    for (int r : slow) names += (names.empty() ? "" : ", ") + std::to_string(r);
    out += fmt::format("  straggler{}: rank{} {} (over {:.0f}% slower than the fastest); look at that host's load, "
                       "clocks and data loading\n",
                       slow.size() > 1 ? "s" : "", slow.size() > 1 ? "s" : "", names, threshold * 100);
  }
  return out;
}

StragglerReport make_straggler_report(const std::vector<StepSummary>& per_rank, StragglerOptions options) {
  if (!(options.threshold() >= 0))
    throw ConfigError(fmt::format("StragglerOptions::threshold: {} must be >= 0 (0.2 names ranks over 20% slower)",
                                  options.threshold()));
  StragglerReport report;
  report.threshold = options.threshold();
  double fastest = std::numeric_limits<double>::infinity();
  for (const auto& s : per_rank)
    if (s.count > 0) fastest = std::min(fastest, s.median_s);
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    RankSteps rs;
    rs.rank = static_cast<int>(r);
    rs.steps = per_rank[r];
    if (rs.steps.count > 0 && rs.steps.median_s > 0) {
      rs.score = fastest / rs.steps.median_s;
      rs.straggler = rs.steps.median_s > fastest * (1 + options.threshold());
    }
    report.ranks.push_back(rs);
  }
  return report;
}

StragglerReport gather_straggler_report(comm::Group& group, c10::Device device, const StepSummary& mine,
                                        StragglerOptions options) {
  auto row = at::tensor({static_cast<double>(mine.count), mine.median_s, mine.p90_s},
                        at::TensorOptions().dtype(at::kDouble)).to(device);
  auto parts = group.all_gather(row);
  std::vector<StepSummary> per_rank;
  for (const auto& p : parts) {
    auto cpu = p.cpu();
    auto v = cpu.accessor<double, 1>();
    per_rank.push_back({static_cast<std::int64_t>(v[0]), v[1], v[2]});
  }
  return make_straggler_report(per_rank, options);
}

void report_to_launcher(const std::string& text, const comm::EnvMap& env) {
  auto it = env.find("COHORT_REPORT_FILE");
  if (it == env.end() || it->second.empty()) return;
  std::ofstream out(it->second, std::ios::app);
  out << text;
  out.close();
  if (!out) std::cerr << "cohort: could not write the report for the launcher to " << it->second << std::endl;
}

}  // namespace cohort::trace
