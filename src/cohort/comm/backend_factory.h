#pragma once
// Builds the c10d backend for a set of ranks: Gloo on CPU, NCCL on CUDA (when this
// LibTorch has it).
#include <string>

#include "cohort/comm/environment.h"
#include "cohort/comm/options.h"
#include "cohort/compat/c10d.h"
#include "cohort/system/cuda.h"

namespace cohort::comm {

// "gloo" or "nccl" from InitOptions::backend(). "auto" is NCCL when this build has
// it and every local rank gets a GPU of its own (NCCL refuses two ranks on one GPU),
// Gloo otherwise: a CUDA LibTorch without a GPU gets Gloo. Throws ConfigError for a
// backend this build lacks, and for NCCL without a GPU per local rank, naming which
// of the two is missing (`cuda` is system::detect_cuda(), a parameter for tests).
std::string resolve_backend(const std::string& requested, int local_world_size, const system::CudaSupport& cuda);

// The device a rank's tensors live on: the CPU for Gloo; for NCCL, the GPU of its
// local rank. Throws ConfigError naming the GPU count when there is no such GPU.
c10::Device device_for_backend(const std::string& backend, int local_rank, const system::CudaSupport& cuda);

// Backends compiled into this build of cohort, e.g. {"gloo"} or {"gloo","nccl"}.
std::vector<std::string> available_backends();

c10::intrusive_ptr<compat::Backend> make_backend(const std::string& backend,
                                                 const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                 const WorldInfo& info, const InitOptions& options);

}  // namespace cohort::comm
