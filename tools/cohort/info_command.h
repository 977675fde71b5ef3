#pragma once
#include <ostream>

namespace cohort::tools {

struct InfoOptions {
  bool json = false;          // --json: one machine-readable line
  bool measure_gemm = true;   // --no-gemm skips the GEMM measurement (about a second)
};

// `cohort info`: LibTorch, backends, devices, the BLAS and thread settings, and a
// measured GEMM rate. A warning naming the fix goes to `err` on the reference BLAS.
int info_command(const InfoOptions& options, std::ostream& out, std::ostream& err);

}  // namespace cohort::tools
