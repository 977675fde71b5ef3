#include "performance.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <algorithm>

#include "cohort/system/blas.h"

namespace gpt {

namespace {
int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return 1;
}
}  // namespace

double measure_peak_gflops(const cohort::comm::World& world, c10::Device device) {
  if (!device.is_cpu()) return 0;
  const double per_core = cohort::system::gemm_gflops_one_core();
  const int nodes = std::max(1, world.size() / std::max(1, world.local_size()));
  const int cores = std::min(usable_cores(), world.local_size() * at::get_num_threads());
  return per_core * cores * nodes;
}

nlohmann::json utilisation(double model_flops_per_second, double peak_gflops) {
  const double gflops = model_flops_per_second / 1e9;
  nlohmann::json out = {{"gflops", gflops}};
  out["gemm_peak_gflops"] = peak_gflops > 0 ? nlohmann::json(peak_gflops) : nlohmann::json(nullptr);
  out["mfu"] = peak_gflops > 0 ? nlohmann::json(gflops / peak_gflops) : nlohmann::json(nullptr);
  return out;
}

}  // namespace gpt
