#pragma once
// Ranks as threads over one in-memory store, for DDP tests that need a group but
// not separate processes. Data must be generated before the threads start:
// torch::manual_seed is process-wide.
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <future>
#include <vector>

#include "cohort/comm/world.h"

namespace cohort::testing {

inline comm::InitOptions quick_thread_world_options() {
  using namespace std::chrono_literals;
  return comm::InitOptions().backend("gloo").timeout(20s).join_timeout(20s);
}

// Runs body(world) on `n` threads that share a HashStore; rethrows the first error.
template <typename Body>
void run_thread_world(int n, Body body, comm::InitOptions options = quick_thread_world_options()) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < n; ++r)
    ranks.push_back(std::async(std::launch::async, [=] {
      auto world = comm::World::init_with_store(store, r, n, options);
      body(world);
    }));
  for (auto& f : ranks) f.get();
}

}  // namespace cohort::testing
