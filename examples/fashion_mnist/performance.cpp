#include "performance.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <algorithm>
#include <iostream>

#include "cohort/comm/environment.h"
#include "cohort/system/blas.h"
#include "cohort/trace/straggler.h"
#include "model.h"

namespace fashion_mnist {
namespace {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return 1;
}

}  // namespace

void report_stragglers(const cohort::trace::StepProfiler& profiler, std::size_t first, cohort::comm::World& world,
                       c10::Device device, const TrainerOptions& o, const std::string& title, bool to_launcher) {
  auto report = cohort::trace::gather_straggler_report(
      world.group(), device, profiler.work_times().summary(first),
      cohort::trace::StragglerOptions().threshold(o.straggler_threshold));
  if (world.rank() != 0) return;
  const auto text = report.format(title);
  std::cout << text << std::flush;
  if (to_launcher) cohort::trace::report_to_launcher(text, cohort::comm::process_environment());
}

nlohmann::json performance_summary(const cohort::trace::StepProfiler& profiler, double samples_per_second,
                                   const cohort::comm::World& world, c10::Device device) {
  nlohmann::json out;
  const double steps = static_cast<double>(std::max<std::int64_t>(profiler.steps(), 1));
  nlohmann::json phases = nlohmann::json::object();
  for (const auto& [name, seconds] : profiler.phase_seconds()) phases[name] = seconds / steps;
  phases["step"] = profiler.step_seconds() / steps;
  out["phases_seconds_per_step"] = phases;
  const double gflops = samples_per_second * FashionNetImpl::training_flops_per_sample() / 1e9;
  out["gflops"] = gflops;
  if (device.is_cpu()) {
    // Note [Measured peak]: the peak is what one core reaches on a GEMM with this
    // LibTorch and BLAS, times the cores the workers may use: the most a CPU
    // training step can approach, since convolutions and linear layers are GEMMs
    // or close to them.
    const double per_core = cohort::system::gemm_gflops_one_core();
    const int nodes = std::max(1, world.size() / std::max(1, world.local_size()));
    const int cores = std::min(usable_cores(), world.local_size() * at::get_num_threads());
    const double peak = per_core * cores * nodes;
    out["gemm_gflops_per_core"] = per_core;
    out["gemm_peak_gflops"] = peak;
    out["fraction_of_peak"] = gflops / peak;
  }
  return out;
}

}  // namespace fashion_mnist
