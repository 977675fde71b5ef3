// What this process's LibTorch says about CUDA, against how cohort was built:
// Debian's and pip's CUDA LibTorch both have NCCL, so COHORT_HAVE_NCCL means a CUDA
// LibTorch. This catches a link that drops libtorch_cuda.so (Note [Is this a CUDA
// LibTorch]), which would make a GPU machine train on its CPU without a word.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <fstream>

#include "cohort/system/cuda.h"

namespace {

TEST(CudaSupport, MatchesHowCohortWasBuilt) {
  const auto cuda = cohort::system::detect_cuda();
#ifdef COHORT_HAVE_NCCL
  EXPECT_TRUE(cuda.built_with_cuda) << "cohort was built against a CUDA LibTorch, but libtorch_cuda is not loaded";
  EXPECT_GE(cuda.runtime_version, 10000);
#else
  EXPECT_FALSE(cuda.built_with_cuda);
  EXPECT_EQ(cuda.runtime_version, 0);
  EXPECT_EQ(cuda.visible_gpus, 0);
#endif
  EXPECT_EQ(cuda.visible_gpus, static_cast<int>(torch::cuda::device_count()));
  // The NVIDIA driver's device node is the independent witness of a GPU.
  if (!std::ifstream("/dev/nvidia0").good()) {
    EXPECT_EQ(cuda.visible_gpus, 0);
    EXPECT_NE(cuda.why_no_gpu(), "");
  }
}

}  // namespace
