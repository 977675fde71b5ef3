#include "cohort/system/cuda.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include <cstdlib>

namespace cohort::system {

// Note [Is this a CUDA LibTorch]
// torch::cuda::is_available() is false both for a CPU-only LibTorch and for a CUDA
// one without a GPU. ATen's CUDA hooks tell them apart: the default hooks (no CUDA
// library loaded) answer hasCUDART() with false, the CUDA library's with true. The
// answer depends on libtorch_cuda.so being loaded: a link with --as-needed that
// drops it makes a CUDA LibTorch look CPU-only (and see no GPU on a GPU machine),
// which is why `cohort info` says which of the two it found.
CudaSupport detect_cuda() {
  CudaSupport s;
  const auto& hooks = at::detail::getCUDAHooks();
  s.built_with_cuda = hooks.hasCUDART();
  if (s.built_with_cuda) s.runtime_version = hooks.versionCUDART();
  s.visible_gpus = static_cast<int>(torch::cuda::device_count());
  return s;
}

std::string CudaSupport::describe() const {
  if (!built_with_cuda) return "CPU-only LibTorch";
  const auto runtime = fmt::format("CUDA LibTorch (runtime {}.{})", runtime_version / 1000, runtime_version % 1000 / 10);
  if (visible_gpus == 0) return runtime + ", no GPU visible";
  return fmt::format("{}, {} GPU{} visible", runtime, visible_gpus, visible_gpus == 1 ? "" : "s");
}

std::string CudaSupport::why_no_gpu() const {
  if (visible_gpus > 0) return "";
  if (!built_with_cuda)
    return "this LibTorch was built without CUDA; link a CUDA build of LibTorch (pip's torch, the official "
           "CUDA zip, or Debian's libtorch-cuda-dev) and run on a machine with a GPU";
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return fmt::format("this LibTorch has CUDA (runtime {}.{}) but no GPU is visible (CUDA_VISIBLE_DEVICES={}); run on "
                     "a machine with a GPU and its NVIDIA driver",
                     runtime_version / 1000, runtime_version % 1000 / 10, visible ? visible : "(unset)");
}

}  // namespace cohort::system
