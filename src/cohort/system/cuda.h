#pragma once
// What this process's LibTorch can do with CUDA: whether it was built with CUDA,
// which CUDA runtime, and how many GPUs it sees. A CUDA LibTorch on a machine
// without a GPU (a login node, a CI box) is a normal case: everything takes the CPU
// paths, and asking for CUDA gets an error that says which of the two is missing.
#include <string>

namespace cohort::system {

struct CudaSupport {
  bool built_with_cuda = false;  // LibTorch's CUDA library is loaded (libtorch_cuda)
  long runtime_version = 0;      // CUDART_VERSION LibTorch was built with, e.g. 12040; 0 without CUDA
  int visible_gpus = 0;          // torch::cuda::device_count()

  // "CPU-only LibTorch", "CUDA LibTorch (runtime 12.4), no GPU visible" or
  // "CUDA LibTorch (runtime 12.4), 2 GPUs visible".
  std::string describe() const;
  // Why CUDA cannot be used here, with the fix; "" when a GPU is visible.
  std::string why_no_gpu() const;
};

CudaSupport detect_cuda();

}  // namespace cohort::system
