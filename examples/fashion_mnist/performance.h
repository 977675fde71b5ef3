#pragma once
// The trainer's performance report: where a step's time goes (a profile of its
// phases), the FLOP/s achieved against the machine's measured GEMM peak, and the
// straggler report. docs/performance.md explains how to read them.
#include <c10/core/Device.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cohort/comm/world.h"
#include "cohort/trace/step_profiler.h"
#include "options.h"

namespace fashion_mnist {

// Collective: every rank calls it at the same step. Rank 0 prints the report for
// the steps from index `first` on; with `to_launcher`, it also hands it to
// `cohort run`'s summary.
void report_stragglers(const cohort::trace::StepProfiler& profiler, std::size_t first, cohort::comm::World& world,
                       c10::Device device, const TrainerOptions& o, const std::string& title, bool to_launcher);

// Rank 0's share of the final JSON line: "phases" (seconds per step), "gflops"
// (model FLOP/s achieved by the whole job), and on the CPU "gemm_peak_gflops" (one
// core's measured GEMM rate times the cores the workers use) and "fraction_of_peak".
nlohmann::json performance_summary(const cohort::trace::StepProfiler& profiler, double samples_per_second,
                                   const cohort::comm::World& world, c10::Device device);

}  // namespace fashion_mnist
