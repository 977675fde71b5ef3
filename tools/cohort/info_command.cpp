#include "info_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cohort/comm/backend_factory.h"
#include "cohort/compat/c10d.h"
#include "cohort/launcher/agent.h"
#include "cohort/system/blas.h"
#include "cohort/system/cuda.h"

namespace cohort::tools {

int info_command(const InfoOptions& options, std::ostream& out, std::ostream& err) {
  auto backends = comm::available_backends();
  auto res = launcher::detect_resources();
  auto has = [&](const char* b) { return std::find(backends.begin(), backends.end(), b) != backends.end(); };
  auto version = fmt::format("{}.{}", compat::kTorchMajor, compat::kTorchMinor);
  const auto blas = system::detect_blas();
  const auto threads = system::thread_settings();
  const double gflops = options.measure_gemm ? system::gemm_gflops_one_core() : -1;
  const auto warning = system::blas_warning(blas);
  const auto cuda = system::detect_cuda();
  if (options.json) {
    nlohmann::json j;
    j["libtorch"] = version;
    j["backends"] = {{"gloo", has("gloo")}, {"nccl", has("nccl")}, {"mpi", has("mpi")}};
    j["cpus"] = res.cpu_count;
    j["cuda_available"] = cuda.visible_gpus > 0;
    j["cuda"] = {{"libtorch_has_cuda", cuda.built_with_cuda},
                 {"runtime", cuda.runtime_version},
                 {"gpus", cuda.visible_gpus},
                 {"summary", cuda.describe()}};
    j["gpus"] = res.gpu_count;
    j["blas"] = {{"name", blas.name}, {"library", blas.library}, {"config", blas.config},
                 {"threads", blas.threads}, {"reference", blas.reference()}};
    j["threads"] = {{"intra_op", threads.intra_op},
                    {"inter_op", threads.inter_op},
                    {"blas", threads.blas},
                    {"OMP_NUM_THREADS", threads.omp_num_threads},
                    {"OPENBLAS_NUM_THREADS", threads.openblas_num_threads}};
    if (gflops > 0) j["gemm_gflops_per_core"] = gflops;
    out << j.dump() << "\n";
  } else {
    out << fmt::format("cohort {}\n", COHORT_VERSION);
    out << fmt::format("LibTorch: {} ({})\n", version, cuda.describe());
    out << fmt::format("backends: gloo {}, nccl {}, mpi {}\n", has("gloo") ? "yes" : "no",
                       has("nccl") ? "yes" : "no", has("mpi") ? "yes" : "no");
    out << fmt::format("devices: cpu ({} cores usable)", res.cpu_count);
    if (res.gpu_count > 0)
      for (int i = 0; i < res.gpu_count; ++i) out << fmt::format(", cuda:{}", i);
    else
      out << ", no CUDA device";
    out << "\n";
    out << fmt::format("BLAS: {}{}{}\n", blas.name, blas.library.empty() ? "" : " (" + blas.library + ")",
                       blas.config.empty() ? "" : ", " + blas.config);
    out << fmt::format("threads: intra-op {}, inter-op {}, BLAS {}; OMP_NUM_THREADS={}, OPENBLAS_NUM_THREADS={}\n",
                       threads.intra_op, threads.inter_op, threads.blas < 0 ? "n/a" : std::to_string(threads.blas),
                       threads.omp_num_threads.empty() ? "(unset)" : threads.omp_num_threads,
                       threads.openblas_num_threads.empty() ? "(unset)" : threads.openblas_num_threads);
    if (gflops > 0) out << fmt::format("GEMM: {:.1f} GFLOP/s per core (512x512 float, one thread, median)\n", gflops);
  }
  if (!warning.empty()) err << "cohort info: " << warning << "\n";
  return 0;
}

}  // namespace cohort::tools
