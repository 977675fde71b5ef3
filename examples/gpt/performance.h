#pragma once
// Model FLOP utilisation (MFU): the model's FLOP/s (GptImpl::training_flops at the
// measured tokens/s) against the machine's measured GEMM rate, the one `cohort info`
// reports (cohort::system::gemm_gflops_one_core) times the cores the workers use
// (Note [Measured peak] in examples/fashion_mnist/performance.cpp). On a GPU there is
// no measured peak yet, and no MFU.
#include <c10/core/Device.h>

#include <nlohmann/json.hpp>

#include "cohort/comm/world.h"

namespace gpt {

// Collective-free; call it on every local rank at once, before training, so each
// measures its own core undisturbed. GFLOP/s of the whole job's cores; 0 on a GPU.
double measure_peak_gflops(const cohort::comm::World& world, c10::Device device);

// "gflops", "gemm_peak_gflops" and "mfu" for the final JSON line (mfu null without a peak).
nlohmann::json utilisation(double model_flops_per_second, double peak_gflops);

}  // namespace gpt
