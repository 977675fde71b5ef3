#include "cohort/store/store_wait.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <thread>

namespace cohort::store {

bool is_c10d_tcp_store(c10d::Store& store) {
  c10d::Store* s = &store;
  while (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(s)) s = prefixed->getUnderlyingStore().get();
  return dynamic_cast<c10d::TCPStore*>(s) != nullptr;
}

bool wait_for_key(c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout,
                  std::chrono::microseconds longest_pause) {
  using Clock = std::chrono::steady_clock;
  if (!is_c10d_tcp_store(store)) {
    try {
      store.wait({key}, timeout);
      return true;
    } catch (const std::exception&) {
      // Ran out, or the store failed: check() tells which (it throws on the latter).
      return store.check({key});
    }
  }
  const auto deadline = Clock::now() + timeout;
  std::chrono::microseconds pause(100);
  while (!store.check({key})) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, longest_pause);
  }
  return true;
}

}  // namespace cohort::store
