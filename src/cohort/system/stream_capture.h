#pragma once
// Whether the current stream of `device` is being captured into a CUDA graph: then
// the host must not wait for the device (a wait or an event query ends the capture
// with an error), and what it launches runs only when the graph is replayed
// (Note [DDP inside a CUDA graph] in ddp/step_end.cpp). Always false off CUDA and
// in a LibTorch without CUDA (COHORT_HAVE_NCCL: every CUDA LibTorch that cohort
// supports has NCCL).
#include <c10/core/Device.h>

#ifdef COHORT_HAVE_NCCL
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace cohort::system {

inline bool stream_capturing(const c10::Device& device) {
#ifdef COHORT_HAVE_NCCL
  if (!device.is_cuda()) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device.index()).stream(), &status));
  return status != cudaStreamCaptureStatusNone;
#else
  (void)device;
  return false;
#endif
}

}  // namespace cohort::system
