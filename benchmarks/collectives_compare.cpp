// All-reduce latency through cohort's Group, one process per rank. Run under
// `cohort run` beside collectives_peer.py (PyTorch's own torch.distributed), with
// the same protocol, by compare_collectives.sh:
//   for each size: 20 warm-up calls, then 7 repetitions of N calls each, a barrier
//   before each repetition; the result is the median over repetitions of the mean
//   latency per call. Rank 0 prints one JSON line per size.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "cohort/comm/world.h"
#include "cohort/elastic/error_file.h"

namespace {

struct Size {
  int64_t numel;
  int calls;
};
constexpr Size kSizes[] = {{1, 400}, {1024, 400}, {32768, 100}, {1048576, 20}};
constexpr int kWarmup = 20;
constexpr int kRepetitions = 7;

}  // namespace

int main() {
  return cohort::elastic::record([] {
    auto world = cohort::comm::World::init();
    auto& g = world.group();
    for (auto [numel, calls] : kSizes) {
      auto t = torch::ones({numel});
      for (int i = 0; i < kWarmup; ++i) g.all_reduce(t);
      std::vector<double> means;
      for (int r = 0; r < kRepetitions; ++r) {
        g.barrier();
        auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < calls; ++i) g.all_reduce(t);
        std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
        means.push_back(took.count() / calls);
      }
      std::sort(means.begin(), means.end());
      if (world.rank() == 0)
        std::printf("{\"impl\": \"cohort\", \"op\": \"all_reduce\", \"world\": %d, \"numel\": %lld, "
                    "\"median_us\": %.1f, \"min_us\": %.1f, \"max_us\": %.1f}\n",
                    world.size(), static_cast<long long>(numel), means[kRepetitions / 2], means.front(),
                    means.back());
    }
    return 0;
  });
}
