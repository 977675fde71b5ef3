#include "gpu_peak.h"

#include <algorithm>
#include <cctype>
#include <vector>

namespace gpt {

namespace {

struct Entry {
  const char* key;  // upper case, matched anywhere in the driver's name
  TablePeak peak;
};

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

}  // namespace

// Note [Peaks from datasheets]
// MFU divides the model's FLOP/s by what the GPU's tensor cores can do in bf16 on
// dense matrices: NVIDIA's datasheets print the bf16 figure with 2:4 structured
// sparsity and mark it (*), so the dense figure is half of it. Names are what
// cudaGetDeviceProperties / nvidia-smi report ("NVIDIA H100 80GB HBM3" is the SXM5
// part, whose datasheet column is "H100 SXM"). The same silicon at a lower power
// limit has a lower peak (the PCIe and NVL parts), so those keys come first. A
// GPU not listed gets no MFU rather than a guess; --peak-tflops names its peak.
// (A measured GEMM rate, as on the CPU, would say what the machine reaches, not
// what the hardware can do; the usual MFU, PaLM's and nanoGPT's, takes the latter.)
std::optional<TablePeak> bf16_peak_by_name(const std::string& gpu_name) {
  static const std::vector<Entry> table{
      // NVIDIA H100 Tensor Core GPU datasheet (2023): BF16 1,979* / 1,513* / 1,671* TFLOPS.
      {"H100 PCIE", {756.0, "H100 PCIe", "NVIDIA H100 datasheet: 1513 TFLOPS bf16 with sparsity"}},
      {"H100 NVL", {835.0, "H100 NVL", "NVIDIA H100 datasheet: 1671 TFLOPS bf16 with sparsity"}},
      {"H100", {989.4, "H100 SXM", "NVIDIA H100 datasheet: 1979 TFLOPS bf16 with sparsity"}},
      // NVIDIA H200 Tensor Core GPU datasheet (2024): BF16 1,979* (SXM) / 1,671* (NVL).
      {"H200 NVL", {835.0, "H200 NVL", "NVIDIA H200 datasheet: 1671 TFLOPS bf16 with sparsity"}},
      {"GH200", {989.4, "GH200", "NVIDIA GH200 datasheet: 1979 TFLOPS bf16 with sparsity"}},
      {"H200", {989.4, "H200 SXM", "NVIDIA H200 datasheet: 1979 TFLOPS bf16 with sparsity"}},
      // NVIDIA A100 datasheet (2021): BF16 312 / 624* TFLOPS, SXM and PCIe alike.
      {"A100", {312.0, "A100", "NVIDIA A100 datasheet: 312 TFLOPS bf16 dense"}},
      // NVIDIA L40S datasheet (2023): BF16 362.05 / 733* TFLOPS.
      {"L40S", {362.05, "L40S", "NVIDIA L40S datasheet: 362.05 TFLOPS bf16 dense"}},
  };
  const auto name = upper(gpu_name);
  for (const auto& e : table)
    if (name.find(e.key) != std::string::npos) return e.peak;
  return std::nullopt;
}

}  // namespace gpt
