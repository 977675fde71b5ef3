#pragma once
// c10d's TCPStore server with the backend a caller asks for, and which one it got.
// Apart from compat/c10d.h so that the library's sources, which never ask for libuv,
// do not depend on it; the store benchmark (benchmarks/scale/store_bench.cpp) does.
//
//   auto server = cohort::compat::make_tcp_store_server(cohort::compat::TcpStoreBackend::kLibUv, timeout);
//   std::cout << cohort::compat::tcp_store_backend_name(*server);  // "c10d-libuv"
//
// Note [TCPStore's backends]: LibTorch 2.2 added a libuv server (TCPStoreOptions::
// useLibUV), the default since 2.4; before 2.2 the classic server, one thread polling
// every connection, was the only one. Asking for libuv where it does not exist gives
// the classic server; tcp_store_backend_name() tells which one runs.
#include <chrono>
#include <string>

#include "cohort/compat/c10d.h"

namespace cohort::compat {

enum class TcpStoreBackend { kClassic, kLibUv };

// A TCPStore server on 127.0.0.1 at a free port (TCPStore::getPort() tells which),
// waiting for no workers.
inline c10::intrusive_ptr<c10d::TCPStore> make_tcp_store_server(TcpStoreBackend backend,
                                                                std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = 0;
  opts.isServer = true;
  opts.waitWorkers = false;
  opts.timeout = timeout;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  opts.useLibUV = backend == TcpStoreBackend::kLibUv;
#else
  (void)backend;
#endif
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
}

// "c10d-libuv" or "c10d-classic": the server `store` runs (for a client, what the
// client was built to ask for, which tells nothing about the server).
inline std::string tcp_store_backend_name(const c10d::TCPStore& store) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  return store.isLibUvBackend() ? "c10d-libuv" : "c10d-classic";
#else
  (void)store;
  return "c10d-classic";
#endif
}

// "1.13.1" and the like: the LibTorch this program was built against.
inline std::string torch_version() { return TORCH_VERSION; }

}  // namespace cohort::compat
