#include "info_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "cohort/comm/backend_factory.h"
#include "cohort/compat/c10d.h"
#include "cohort/launcher/agent.h"

namespace cohort::tools {

int info_command(bool json, std::ostream& out) {
  auto backends = comm::available_backends();
  auto res = launcher::detect_resources();
  auto has = [&](const char* b) { return std::find(backends.begin(), backends.end(), b) != backends.end(); };
  auto version = fmt::format("{}.{}", compat::kTorchMajor, compat::kTorchMinor);
  if (json) {
    nlohmann::json j;
    j["libtorch"] = version;
    j["backends"] = {{"gloo", has("gloo")}, {"nccl", has("nccl")}, {"mpi", has("mpi")}};
    j["cpus"] = res.cpu_count;
    j["cuda_available"] = torch::cuda::is_available();
    j["gpus"] = res.gpu_count;
    out << j.dump() << "\n";
    return 0;
  }
  out << fmt::format("cohort {}\n", COHORT_VERSION);
  out << fmt::format("LibTorch: {}\n", version);
  out << fmt::format("backends: gloo {}, nccl {}, mpi {}\n", has("gloo") ? "yes" : "no", has("nccl") ? "yes" : "no",
                     has("mpi") ? "yes" : "no");
  out << fmt::format("devices: cpu ({} cores usable)", res.cpu_count);
  if (res.gpu_count > 0)
    for (int i = 0; i < res.gpu_count; ++i) out << fmt::format(", cuda:{}", i);
  else
    out << ", no CUDA device";
  out << "\n";
  return 0;
}

}  // namespace cohort::tools
