// Latency of cohort's bounded collectives against the raw c10d backend they wrap, on
// ranks as threads over one in-memory store (Gloo over loopback). It measures what
// cohort adds per call: argument checks, the arrival board, and the bounded wait.
//   ./build/benchmarks/collectives_bench --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "cohort/comm/world.h"

namespace {
using cohort::comm::World;

// Rank 0 runs in the benchmark thread; rank 1 mirrors every call on its own thread.
// Google Benchmark fixes the iteration count before the timed loop, so the peer is
// told how many calls to make and both sides stay in lockstep.
class Peer {
 public:
  template <typename Op>
  Peer(World world, int64_t numel, Op op) : thread_([this, world, numel, op]() mutable {
      auto t = torch::ones({numel});
      while (true) {
        int64_t n;
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return pending_ != 0; });
          n = pending_;
        }
        if (n < 0) return;
        for (int64_t i = 0; i < n; ++i) op(world, t);
        {
          std::lock_guard<std::mutex> lock(mu_);
          pending_ = 0;
        }
        cv_.notify_all();
      }
    }) {}
  ~Peer() {
    order(-1);
    thread_.join();
  }
  void order(int64_t calls) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_ = calls;
    }
    cv_.notify_all();
  }
  void wait_done() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t pending_ = 0;
  std::thread thread_;
};

template <typename Op>
void two_ranks(benchmark::State& state, Op op) {
  const int64_t numel = state.range(0);
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto options = cohort::comm::InitOptions().backend("gloo");
  auto peer_world = std::async(std::launch::async, [&] { return World::init_with_store(store, 1, 2, options); });
  auto world = World::init_with_store(store, 0, 2, options);
  Peer peer(peer_world.get(), numel, op);
  auto t = torch::ones({numel});
  peer.order(3);  // warm-up
  for (int i = 0; i < 3; ++i) op(world, t);
  peer.wait_done();
  peer.order(static_cast<int64_t>(state.max_iterations));
  for (auto _ : state) op(world, t);
  peer.wait_done();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * numel * static_cast<int64_t>(sizeof(float)));
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
