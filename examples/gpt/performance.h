#pragma once
// Model FLOP utilisation (MFU): the model's FLOP/s (GptImpl::training_flops at the
// measured tokens/s) against a peak. On the CPU the peak is the machine's measured
// GEMM rate, the one `cohort info` reports (cohort::system::gemm_gflops_one_core)
// times the cores the workers use (Note [Measured peak] in
// examples/fashion_mnist/performance.cpp). On a GPU it is the device's dense bf16
// peak from its datasheet, found by the name the driver reports (gpu_peak.h), or
// --peak-tflops; a GPU the table does not know gets no MFU (null), and says so.
#include <c10/core/Device.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cohort/comm/world.h"

namespace gpt {

struct Peak {
  double gflops = 0;        // the whole job's peak; 0: unknown, no MFU
  std::string source;       // what the figure is: "measured", "table", "--peak-tflops" or "unknown"
  std::string detail;       // the measurement's cores, the table's entry and its datasheet, or why unknown
  std::string device_name;  // the GPU's name as its driver reports it; empty on the CPU
};

// The peak the MFU divides by. override_tflops > 0 (--peak-tflops) wins, per
// process, times the world's size. Otherwise on the CPU: collective-free, call it
// on every local rank at once, before training, so each measures its own core
// undisturbed. On CUDA: the table's dense bf16 peak for the device's name, times
// the world's size (one GPU per process).
Peak find_peak(const cohort::comm::World& world, c10::Device device, double override_tflops);

// "gflops", "gemm_peak_gflops" (the CPU's measured peak, else null), "peak_tflops",
// "peak_source", "peak_detail", "device_name" and "mfu" (null without a peak) for
// the final JSON line.
nlohmann::json utilisation(double model_flops_per_second, const Peak& peak);

}  // namespace gpt
