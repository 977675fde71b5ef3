#include "performance.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <sched.h>

#include <algorithm>

#include "cohort/system/blas.h"
#include "gpu_peak.h"

namespace gpt {

namespace {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return 1;
}

// Note [The GPU's name without CUDA's headers]
// This file builds against every LibTorch, the CPU-only ones included, so it asks
// the NVIDIA driver (libcuda.so.1, which a CUDA LibTorch has loaded already) for the
// name through dlopen, not through ATen's CUDA headers. The driver numbers the
// devices as the runtime does (both honour CUDA_VISIBLE_DEVICES). Empty when the
// driver cannot be loaded or answers with an error.
std::string cuda_device_name(int index) {
  void* driver = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) return "";
  using Init = int (*)(unsigned);
  using Get = int (*)(int*, int);
  using Name = int (*)(char*, int, int);
  auto init = reinterpret_cast<Init>(::dlsym(driver, "cuInit"));
  auto get = reinterpret_cast<Get>(::dlsym(driver, "cuDeviceGet"));
  auto name = reinterpret_cast<Name>(::dlsym(driver, "cuDeviceGetName"));
  std::string out;
  int device = 0;
  char buffer[256] = {};
  if (init && get && name && init(0) == 0 && get(&device, index) == 0 && name(buffer, sizeof(buffer) - 1, device) == 0)
    out = buffer;
  ::dlclose(driver);
  return out;
}

}  // namespace

Peak find_peak(const cohort::comm::World& world, c10::Device device, double override_tflops) {
  Peak peak;
  if (device.is_cuda()) peak.device_name = cuda_device_name(device.index() < 0 ? 0 : device.index());
  if (override_tflops > 0) {
    peak.gflops = override_tflops * 1e3 * world.size();
    peak.source = "--peak-tflops";
    peak.detail = fmt::format("{} TFLOPS per process, given", override_tflops);
    return peak;
  }
  if (device.is_cpu()) {
    const double per_core = cohort::system::gemm_gflops_one_core();
    const int nodes = std::max(1, world.size() / std::max(1, world.local_size()));
    const int cores = std::min(usable_cores(), world.local_size() * at::get_num_threads());
    peak.gflops = per_core * cores * nodes;
    peak.source = "measured";
    peak.detail = fmt::format("a GEMM on one core, {:.1f} GFLOP/s, times {} core(s) on each of {} node(s)",
                              per_core, cores, nodes);
    return peak;
  }
  if (const auto entry = bf16_peak_by_name(peak.device_name)) {
    peak.gflops = entry->tflops * 1e3 * world.size();
    peak.source = "table";
    peak.detail = fmt::format("{}: {} TFLOPS dense bf16 ({})", entry->model, entry->tflops, entry->source);
    return peak;
  }
  peak.source = "unknown";
  peak.detail = peak.device_name.empty()
                    ? std::string("the GPU's name could not be read from the driver; give --peak-tflops")
                    : fmt::format("no bf16 peak is known for '{}' (examples/gpt/gpu_peak.cpp); give --peak-tflops",
                                  peak.device_name);
  return peak;
}

nlohmann::json utilisation(double model_flops_per_second, const Peak& peak) {
  const double gflops = model_flops_per_second / 1e9;
  const bool known = peak.gflops > 0;
  auto number_or_null = [](bool has, double v) { return has ? nlohmann::json(v) : nlohmann::json(nullptr); };
  return {
      {"gflops", gflops},
      {"gemm_peak_gflops", number_or_null(peak.source == "measured", peak.gflops)},
      {"peak_tflops", number_or_null(known, peak.gflops / 1e3)},
      {"peak_source", peak.source},
      {"peak_detail", peak.detail},
      {"device_name", peak.device_name},
      {"mfu", number_or_null(known, gflops / peak.gflops)},
  };
}

}  // namespace gpt
