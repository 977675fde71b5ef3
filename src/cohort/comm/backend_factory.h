#pragma once
// Builds the c10d backend for a set of ranks: Gloo on CPU, NCCL on CUDA (when this
// LibTorch has it).
#include <string>

#include "cohort/comm/environment.h"
#include "cohort/comm/options.h"
#include "cohort/compat/c10d.h"

namespace cohort::comm {

// "gloo" or "nccl" from InitOptions::backend(). "auto" is NCCL when this build has
// it and every local rank gets a GPU of its own (NCCL refuses two ranks on one GPU),
// Gloo otherwise. Throws ConfigError for a backend this build lacks.
std::string resolve_backend(const std::string& requested, int local_world_size);

// Backends compiled into this build of cohort, e.g. {"gloo"} or {"gloo","nccl"}.
std::vector<std::string> available_backends();

c10::intrusive_ptr<compat::Backend> make_backend(const std::string& backend,
                                                 const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                 const WorldInfo& info, const InitOptions& options);

}  // namespace cohort::comm
