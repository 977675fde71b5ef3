#pragma once
// Ranks as threads over one in-memory store, for DDP tests that need a group but
// not separate processes. Data must be generated before the threads start:
// torch::manual_seed is process-wide.
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <future>
#include <vector>

#include "cohort/comm/world.h"

namespace cohort::testing {

// Runs body(world) on `n` threads; rethrows the first error.
template <typename Body>
void run_thread_world(int n, Body body) {
  using namespace std::chrono_literals;
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto options = comm::InitOptions().backend("gloo").timeout(20s).join_timeout(20s);
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < n; ++r)
    ranks.push_back(std::async(std::launch::async, [=] {
      auto world = comm::World::init_with_store(store, r, n, options);
      body(world);
    }));
  for (auto& f : ranks) f.get();
}

}  // namespace cohort::testing
