#include "cohort/system/blas.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <vector>

namespace cohort::system {
namespace {

template <typename F>
F* find_symbol(const char* name) {
  return reinterpret_cast<F*>(::dlsym(RTLD_DEFAULT, name));
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

BlasInfo detect_blas() {
  BlasInfo info;
  if (at::hasMKL()) {
    info.name = "MKL";  // linked into LibTorch (pip and zip builds)
    return info;
  }
  void* sgemm = ::dlsym(RTLD_DEFAULT, "sgemm_");
  if (!sgemm) {
    info.name = "unknown";
    return info;
  }
  Dl_info where{};
  if (::dladdr(sgemm, &where) && where.dli_fname) {
    std::error_code ec;
    auto real = std::filesystem::canonical(where.dli_fname, ec);
    info.library = ec ? where.dli_fname : real.string();
  }
  // Ask the library that provides sgemm_ (and its dependencies), not the whole
  // process: Debian's LAPACK alternative may load OpenBLAS beside a reference BLAS.
  void* library = where.dli_fname ? ::dlopen(where.dli_fname, RTLD_LAZY | RTLD_NOLOAD) : nullptr;
  auto in_library = [&](const char* name) { return library ? ::dlsym(library, name) : nullptr; };
  if (auto config = reinterpret_cast<char* (*)()>(in_library("openblas_get_config"))) {
    info.name = "OpenBLAS";
    info.config = config();
    if (auto threads = reinterpret_cast<int (*)()>(in_library("openblas_get_num_threads"))) info.threads = threads();
  } else if (in_library("MKL_Get_Max_Threads")) {
    info.name = "MKL";
  } else if (info.library.find("/blas/") != std::string::npos || info.library.find("libblas.so") != std::string::npos) {
    // Debian's netlib build lives in .../blas/libblas.so.3 and exports nothing
    // beyond the BLAS interface.
    info.name = "reference BLAS";
  } else {
    info.name = "unknown";
  }
  if (library) ::dlclose(library);
  return info;
}

void set_blas_threads(int threads) {
  if (detect_blas().name != "OpenBLAS") return;
  if (auto set = find_symbol<void(int)>("openblas_set_num_threads")) set(threads);
}

ThreadSettings thread_settings() {
  ThreadSettings t;
  t.intra_op = at::get_num_threads();
  t.inter_op = at::get_num_interop_threads();
  t.blas = detect_blas().threads;
  t.omp_num_threads = env_or_empty("OMP_NUM_THREADS");
  t.openblas_num_threads = env_or_empty("OPENBLAS_NUM_THREADS");
  return t;
}

double gemm_gflops_one_core(int n, int runs) {
  const int intra = at::get_num_threads();
  const int blas = detect_blas().threads;
  at::set_num_threads(1);
  set_blas_threads(1);
  auto a = at::rand({n, n});
  auto b = at::rand({n, n});
  auto c = at::empty({n, n});
  std::vector<double> seconds;
  for (int i = 0; i < 5 + runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 5) seconds.push_back(s);
  }
  at::set_num_threads(intra);
  if (blas > 0) set_blas_threads(blas);
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  return 2.0 * n * n * n / median / 1e9;
}

std::string blas_warning(const BlasInfo& blas) {
  if (!blas.reference()) return "";
  return fmt::format(
      "warning: LibTorch's matrix products run on the reference BLAS ({}), about 15x slower than OpenBLAS. Fix: "
      "install Debian's OpenBLAS (apt-get install libopenblas0-pthread, which scripts/install-deps does); it "
      "takes over libblas.so.3 with nothing else to change",
      blas.library);
}

}  // namespace cohort::system
