#pragma once
// The dense bf16 peak of a GPU, looked up by the name its driver reports, for the
// GPT trainer's MFU on CUDA (performance.h). The figures are the vendors' datasheet
// numbers without structured sparsity (Note [Peaks from datasheets] in gpu_peak.cpp);
// a GPU the table does not know has no peak, and `gpt --peak-tflops` gives one:
//
//   auto peak = gpt::bf16_peak_by_name("NVIDIA H100 80GB HBM3");  // 989.4 TFLOPS
#include <optional>
#include <string>

namespace gpt {

struct TablePeak {
  double tflops = 0;   // dense bf16 tensor-core TFLOP/s
  std::string model;   // the table's entry: "H100 SXM", ...
  std::string source;  // where the figure comes from
};

// The entry whose key the name contains (case-insensitive; the most specific keys
// first, so "NVIDIA H100 PCIe" is not taken for the SXM part); nullopt when none does.
std::optional<TablePeak> bf16_peak_by_name(const std::string& gpu_name);

}  // namespace gpt
