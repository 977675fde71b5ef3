#pragma once
// The one place where LibTorch's c10d API differences live.
//
// Note [LibTorch versions]
// cohort builds against LibTorch 1.13 (Debian 12), 2.6 (Debian 13) and pip's 2.x with
// CUDA. These differences matter to us:
//  * In 1.13 a backend such as ProcessGroupGloo *is* a c10d::ProcessGroup. In 2.x it
//    derives from c10d::Backend, and c10d::ProcessGroup became a dispatcher over
//    backends. cohort only ever talks to the backend, so compat::Backend names
//    whichever class the backends derive from.
//  * 2.x's TCPStore server defaults to a libuv event loop (TCPStoreOptions::useLibUV),
//    but Debian's 2.6 is built without libuv and throws. make_tcp_store() asks for the
//    classic server wherever the field exists.
//  * 2.1 added append/multiGet/multiSet/hasExtendedApi to c10d::Store; a store
//    overrides them where COHORT_C10D_STORE_HAS_EXTENDED_API is 1.
// Nothing outside compat/ may test TORCH_VERSION_*; autocast.h holds the autocast API,
// optimizer.h the key of torch::optim state,
// allocator.h the c10::Allocator interface, autograd.h autograd's node pointers,
// event.h the timing of c10::Event.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

// c10d::Store::append, multiGet, multiSet and hasExtendedApi exist (LibTorch >= 2.1).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define COHORT_C10D_STORE_HAS_EXTENDED_API 1
#else
#define COHORT_C10D_STORE_HAS_EXTENDED_API 0
#endif

#include <chrono>
#include <cstdint>
#include <string>

namespace cohort::compat {

#if TORCH_VERSION_MAJOR >= 2
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif
using Work = c10d::Work;

inline constexpr int kTorchMajor = TORCH_VERSION_MAJOR;
inline constexpr int kTorchMinor = TORCH_VERSION_MINOR;

// A TCPStore server (is_server) or client. Port 0 on a server binds a free port;
// TCPStore::getPort() then reports it.
inline c10::intrusive_ptr<c10d::TCPStore> make_tcp_store(
    const std::string& host, std::uint16_t port, bool is_server,
    std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = port;
  opts.isServer = is_server;
  opts.waitWorkers = false;  // cohort runs its own bounded join (comm/join.h)
  opts.timeout = timeout;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  // The field arrived with the libuv server in 2.2; before it the classic server
  // was the only one.
  opts.useLibUV = false;
#endif
  return c10::make_intrusive<c10d::TCPStore>(host, opts);
}

}  // namespace cohort::compat
