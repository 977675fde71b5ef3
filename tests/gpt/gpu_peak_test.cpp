// The GPUs' dense bf16 peaks that the GPT trainer's MFU divides by on CUDA
// (examples/gpt/gpu_peak.h, Note [Peaks from datasheets]): the names drivers report,
// the lower-power parts not taken for the SXM ones, and no guess for a GPU not in the
// table. (The flags that go with it, --peak-tflops and --timing-warmup, are tested
// through the flag parser in preset_test.cpp.)
#include <gtest/gtest.h>

#include <string>

#include "gpu_peak.h"

namespace {

double tflops(const std::string& name) {
  const auto peak = gpt::bf16_peak_by_name(name);
  return peak ? peak->tflops : -1;
}

TEST(GpuPeak, TheNamesDriversReportFindTheirDatasheetsDenseBf16Peak) {
  EXPECT_DOUBLE_EQ(tflops("NVIDIA H100 80GB HBM3"), 989.4);  // SXM5
  EXPECT_DOUBLE_EQ(tflops("NVIDIA H200"), 989.4);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA A100-SXM4-80GB"), 312.0);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA A100-PCIE-40GB"), 312.0);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA L40S"), 362.05);
  EXPECT_EQ(gpt::bf16_peak_by_name("NVIDIA H100 80GB HBM3")->model, "H100 SXM");
  EXPECT_NE(gpt::bf16_peak_by_name("NVIDIA H200")->source.find("datasheet"), std::string::npos);
}

TEST(GpuPeak, ThePcieAndNvlPartsAreNotTakenForTheSxmOnes) {
  EXPECT_DOUBLE_EQ(tflops("NVIDIA H100 PCIe"), 756.0);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA H100 NVL"), 835.0);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA H200 NVL"), 835.0);
  EXPECT_EQ(gpt::bf16_peak_by_name("NVIDIA GH200 480GB")->model, "GH200");
  EXPECT_DOUBLE_EQ(tflops("nvidia h100 pcie"), 756.0);  // case does not matter
}

TEST(GpuPeak, AGpuNotInTheTableHasNoPeakRatherThanAGuess) {
  EXPECT_FALSE(gpt::bf16_peak_by_name("Tesla T4"));
  EXPECT_FALSE(gpt::bf16_peak_by_name("NVIDIA GeForce RTX 4090"));
  EXPECT_FALSE(gpt::bf16_peak_by_name(""));  // the driver's name could not be read
}

}  // namespace
