#pragma once
// Which BLAS LibTorch's matrix products run on, how many threads the pools use, and
// what one core achieves on a GEMM. Debian's LibTorch calls whatever the
// libblas.so.3 alternative points at: the reference BLAS unless OpenBLAS is
// installed, about 15 times slower (docs/performance.md). `cohort info` prints this
// and warns on the reference BLAS.
#include <string>

namespace cohort::system {

struct BlasInfo {
  std::string name;     // "OpenBLAS", "MKL", "reference BLAS" or "unknown"
  std::string library;  // the file providing sgemm_, symlinks resolved; empty when built in
  std::string config;   // OpenBLAS's build configuration (core type, threading)
  int threads = -1;     // the BLAS pool's size, -1 when it has none we can ask
  bool reference() const { return name == "reference BLAS"; }
};

BlasInfo detect_blas();

// Sets the BLAS pool's size where the BLAS has one (OpenBLAS); a no-op otherwise.
void set_blas_threads(int threads);

struct ThreadSettings {
  int intra_op = 0;   // at::get_num_threads()
  int inter_op = 0;   // at::get_num_interop_threads()
  int blas = -1;      // BlasInfo::threads
  std::string omp_num_threads;       // the variables as this process got them ("" unset)
  std::string openblas_num_threads;
};
ThreadSettings thread_settings();

// GFLOP/s of an n x n float matrix product (torch::mm) on one thread: 5 warm-up runs,
// then the median of `runs`. Restores the thread settings afterwards.
double gemm_gflops_one_core(int n = 512, int runs = 25);

// One line of advice when the BLAS is the reference one, else "".
std::string blas_warning(const BlasInfo& blas);

}  // namespace cohort::system
