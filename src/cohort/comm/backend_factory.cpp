#include "cohort/comm/backend_factory.h"

// ProcessGroupGloo.hpp declares nothing unless the build says Gloo is in.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cohort/errors.h"

namespace cohort::comm {

#ifdef COHORT_HAVE_NCCL
c10::intrusive_ptr<compat::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                      int size, std::chrono::milliseconds timeout);
#endif

std::vector<std::string> available_backends() {
  std::vector<std::string> out{"gloo"};
#ifdef COHORT_HAVE_NCCL
  out.push_back("nccl");
#endif
  return out;
}

std::string resolve_backend(const std::string& requested, int local_world_size, const system::CudaSupport& cuda) {
  auto have = available_backends();
  const bool nccl = std::find(have.begin(), have.end(), "nccl") != have.end();
  if (requested == "auto") return nccl && cuda.visible_gpus >= local_world_size ? "nccl" : "gloo";
  if (std::find(have.begin(), have.end(), requested) == have.end())
    throw ConfigError(fmt::format("cohort: backend '{}' is not available in this build (available: {}; {}); "
                                  "use one of those, or 'auto'",
                                  requested, fmt::join(have, ", "), cuda.describe()));
  if (requested == "nccl" && cuda.visible_gpus == 0)
    throw ConfigError(fmt::format("cohort: backend 'nccl' needs a GPU per local rank, but {}; or use --backend gloo "
                                  "(or 'auto')",
                                  cuda.why_no_gpu()));
  return requested;
}

c10::Device device_for_backend(const std::string& backend, int local_rank, const system::CudaSupport& cuda) {
  if (backend != "nccl") return c10::Device(c10::kCPU);
  if (local_rank >= cuda.visible_gpus)
    throw ConfigError(fmt::format("cohort: LOCAL_RANK {} needs GPU {} but this host sees {} GPU(s); start at most "
                                  "{} processes per node (cohort run --nproc-per-node gpu) or use --backend gloo",
                                  local_rank, local_rank, cuda.visible_gpus, cuda.visible_gpus));
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

c10::intrusive_ptr<compat::Backend> make_backend(const std::string& backend,
                                                 const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                 const WorldInfo& info, const InitOptions& options) {
#ifdef COHORT_HAVE_NCCL
  if (backend == "nccl") return make_nccl_backend(store, rank, size, options.timeout());
#endif
  TORCH_INTERNAL_ASSERT(backend == "gloo", "unresolved backend ", backend);
  auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout());
  if (!options.network_interface().empty())
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(options.network_interface()));
  else if (info.all_on_this_host())
    // Every peer is on this host: loopback needs no name resolution and no NIC.
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  else
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  opts->threads = options.gloo_threads();  // Note [Gloo threads] in options.h
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}

}  // namespace cohort::comm
