#pragma once
// Which ranks hold the others back. Every rank summarises its own step times; the
// report gathers them and names the ranks whose median step is slower than the
// fastest rank's by more than a threshold.
//
// Note [Straggler step times]: in data-parallel training every rank
// waits for the slowest at each all-reduce, so a rank that computes slowly shows up
// as a longer *compute* time, while the waiting shows up in the others' all-reduce:
// pass the time of the rank's own work (step minus communication wait) when that is
// known, or the whole step otherwise. The score is the fastest median over the
// rank's (1.00 for the fastest, 0.50 for a rank at half speed), as Megatron-LM's
// straggler detector reports relative performance.
//
//   auto report = cohort::trace::gather_straggler_report(world.group(), device, times.summary());
//   if (world.rank() == 0) std::cout << report.format();
#include <c10/core/Device.h>
#include <torch/arg.h>

#include <string>
#include <vector>

#include "cohort/comm/environment.h"
#include "cohort/comm/group.h"
#include "cohort/trace/step_stats.h"

namespace cohort::trace {

struct StragglerOptions {
  // A rank is named when its median step is over (1 + threshold) times the fastest's.
  TORCH_ARG(double, threshold) = 0.2;
};

struct RankSteps {
  int rank = 0;
  StepSummary steps;
  double score = 1;  // fastest median / this median
  bool straggler = false;
};

struct StragglerReport {
  std::vector<RankSteps> ranks;  // by rank
  double threshold = 0.2;
  std::vector<int> stragglers() const;
  // A table, one line per rank, then the verdict.
  std::string format(const std::string& title) const;
};

// Pure: the report for these per-rank summaries (index = rank).
StragglerReport make_straggler_report(const std::vector<StepSummary>& per_rank, StragglerOptions options = {});

// Collective over `group`: every rank passes its own summary and gets the report.
StragglerReport gather_straggler_report(comm::Group& group, c10::Device device, const StepSummary& mine,
                                        StragglerOptions options = {});

// `cohort run` sets COHORT_REPORT_FILE; the launcher prints that file in its summary
// when the workers have exited. Appends `text` there when the variable is set; a
// failure to write is printed, not thrown (the report is not worth a failed job).
void report_to_launcher(const std::string& text, const comm::EnvMap& env);

}  // namespace cohort::trace
