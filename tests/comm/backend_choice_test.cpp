// Which backend and device a rank gets, for every combination of LibTorch build and
// GPU count: the CUDA logic that needs no GPU to test. The machine's own answer is
// checked against the build in tests/system/cuda_test.cpp.
#include <gtest/gtest.h>

#include "cohort/comm/backend_factory.h"
#include "cohort/errors.h"

namespace {

using cohort::comm::device_for_backend;
using cohort::comm::resolve_backend;
using cohort::system::CudaSupport;

constexpr CudaSupport kCpuOnly{false, 0, 0};
constexpr CudaSupport kCudaNoGpu{true, 12040, 0};
constexpr CudaSupport kTwoGpus{true, 12040, 2};

#ifdef COHORT_HAVE_NCCL
constexpr bool kNccl = true;
#else
constexpr bool kNccl = false;
#endif

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const cohort::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(BackendChoice, AutoIsGlooWithoutAGpuPerLocalRank) {
  EXPECT_EQ(resolve_backend("auto", 2, kCpuOnly), "gloo");
  EXPECT_EQ(resolve_backend("auto", 2, kCudaNoGpu), "gloo");
  EXPECT_EQ(resolve_backend("auto", 3, kTwoGpus), "gloo");  // NCCL refuses two ranks on one GPU
  EXPECT_EQ(resolve_backend("auto", 2, kTwoGpus), kNccl ? "nccl" : "gloo");
  EXPECT_EQ(resolve_backend("gloo", 2, kTwoGpus), "gloo");
}

TEST(BackendChoice, NcclWithoutAGpuSaysWhichIsMissing) {
  const auto no_gpu = error_of([] { resolve_backend("nccl", 1, kCudaNoGpu); });
  if (kNccl) {
    EXPECT_NE(no_gpu.find("backend 'nccl' needs a GPU per local rank"), std::string::npos) << no_gpu;
    EXPECT_NE(no_gpu.find("this LibTorch has CUDA (runtime 12.4) but no GPU is visible"), std::string::npos) << no_gpu;
    EXPECT_NE(no_gpu.find("--backend gloo"), std::string::npos) << no_gpu;
    EXPECT_EQ(resolve_backend("nccl", 2, kTwoGpus), "nccl");
  } else {
    EXPECT_NE(no_gpu.find("backend 'nccl' is not available in this build (available: gloo;"), std::string::npos)
        << no_gpu;
    const auto cpu = error_of([] { resolve_backend("nccl", 1, kCpuOnly); });
    EXPECT_NE(cpu.find("CPU-only LibTorch"), std::string::npos) << cpu;
  }
  const auto unknown = error_of([] { resolve_backend("mpi", 1, kCpuOnly); });
  EXPECT_NE(unknown.find("backend 'mpi' is not available"), std::string::npos) << unknown;
}

TEST(BackendChoice, EachNcclRankGetsTheGpuOfItsLocalRank) {
  EXPECT_EQ(device_for_backend("gloo", 1, kTwoGpus), c10::Device(c10::kCPU));
  EXPECT_EQ(device_for_backend("nccl", 0, kTwoGpus), c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(device_for_backend("nccl", 1, kTwoGpus), c10::Device(c10::kCUDA, 1));
  const auto third = error_of([] { device_for_backend("nccl", 2, kTwoGpus); });
  EXPECT_NE(third.find("LOCAL_RANK 2 needs GPU 2 but this host sees 2 GPU(s)"), std::string::npos) << third;
}

TEST(CudaSupport, DescribesBuildAndGpus) {
  EXPECT_EQ(kCpuOnly.describe(), "CPU-only LibTorch");
  EXPECT_EQ(kCudaNoGpu.describe(), "CUDA LibTorch (runtime 12.4), no GPU visible");
  EXPECT_EQ(kTwoGpus.describe(), "CUDA LibTorch (runtime 12.4), 2 GPUs visible");
  EXPECT_EQ((CudaSupport{true, 11080, 1}).describe(), "CUDA LibTorch (runtime 11.8), 1 GPU visible");
  EXPECT_EQ(kTwoGpus.why_no_gpu(), "");
  EXPECT_NE(kCpuOnly.why_no_gpu().find("built without CUDA"), std::string::npos);
  EXPECT_NE(kCudaNoGpu.why_no_gpu().find("no GPU is visible (CUDA_VISIBLE_DEVICES="), std::string::npos);
}

}  // namespace
