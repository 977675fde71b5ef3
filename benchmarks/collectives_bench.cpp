// Latency of cohort's bounded collectives against the raw c10d backend they wrap, on
// ranks as threads over one in-memory store (Gloo over loopback). It measures what
// cohort adds per call: argument checks, the arrival board, and the bounded wait.
//   ./build/benchmarks/collectives_bench --benchmark_repetitions=5 \
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <future>
#include <thread>

#include "cohort/comm/world.h"

namespace {
using cohort::comm::World;

// Rank 0 runs in the benchmark thread; the peer mirrors every call on its own thread.
template <typename Op>
void two_ranks(benchmark::State& state, Op op) {
  const int64_t numel = state.range(0);
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto options = cohort::comm::InitOptions().backend("gloo");
  auto peer_world = std::async(std::launch::async, [&] { return World::init_with_store(store, 1, 2, options); });
  auto world = World::init_with_store(store, 0, 2, options);
  auto peer = peer_world.get();
  auto iterations = std::make_shared<std::atomic<int64_t>>(-1);
  std::thread mirror([&, iterations] {
    auto t = torch::ones({numel});
    while (true) {
      auto n = iterations->load();
      if (n == -2) break;
      if (n < 0) continue;
      for (int64_t i = 0; i < n; ++i) op(peer, t);
      iterations->store(-1);
    }
  });
  auto t = torch::ones({numel});
  for (int i = 0; i < 3; ++i) {  // warm-up
    iterations->store(1);
    op(world, t);
    while (iterations->load() != -1) {
    }
  }
  int64_t count = 0;
  iterations->store(static_cast<int64_t>(state.max_iterations));
  for (auto _ : state) {
    op(world, t);
    ++count;
  }
  while (iterations->load() != -1) {
  }
  iterations->store(-2);
  mirror.join();
  state.SetBytesProcessed(count * numel * static_cast<int64_t>(sizeof(float)));
}

void BM_CohortAllReduce(benchmark::State& state) {
  two_ranks(state, [](World& w, at::Tensor& t) { w.group().all_reduce(t); });
}

void BM_RawC10dAllReduce(benchmark::State& state) {
  two_ranks(state, [](World& w, at::Tensor& t) {
    std::vector<at::Tensor> v{t};
    w.group().backend().allreduce(v)->wait();
  });
}

BENCHMARK(BM_CohortAllReduce)->RangeMultiplier(32)->Range(1, 1 << 20)->UseRealTime();
BENCHMARK(BM_RawC10dAllReduce)->RangeMultiplier(32)->Range(1, 1 << 20)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
