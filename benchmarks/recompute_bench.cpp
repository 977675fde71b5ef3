// Activation checkpointing's trade-off (BENCHMARKS.md): a deep MLP of L blocks trained
// plainly and with checkpoint_sequential in sqrt(L) and in L/2 segments. Reports the
// median step time (forward, backward) over REPS timed steps after WARMUP, and the
// peak of CPU memory allocated by LibTorch during a step beyond what it held before
// (activations and gradients), counted by a wrapper around the CPU allocator.
// Expected: about 1.33x the time (one more forward: F + F + 2F against F + 2F) and
// activation memory from O(L) to O(sqrt L).
//   recompute_bench [--layers L] [--width W] [--batch B] [--reps N]
#include <CLI/CLI.hpp>
#include <c10/core/CPUAllocator.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>

#include "cohort/compat/allocator.h"
#include "cohort/recompute/checkpoint.h"

namespace {

// Note [Counting allocator]: every CPU tensor's bytes pass through here, so the peak
// of live bytes during a step is what the step allocated at its worst.
class CountingAllocator final : public cohort::compat::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate_bytes(std::size_t n) const override {
    auto inner = base_->allocate(n);
    void* data = inner.get();
    auto* ctx = new Context{std::move(inner), n, this};
    const auto live = live_.fetch_add(static_cast<std::int64_t>(n)) + static_cast<std::int64_t>(n);
    auto peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    return {data, ctx, &CountingAllocator::release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
  std::int64_t live() const { return live_.load(); }
  void reset_peak() { peak_.store(live_.load()); }
  std::int64_t peak() const { return peak_.load(); }

 private:
  struct Context {
    c10::DataPtr inner;
    std::size_t bytes;
    const CountingAllocator* owner;
  };
  static void release(void* p) {
    auto* ctx = static_cast<Context*>(p);
    ctx->owner->live_.fetch_sub(static_cast<std::int64_t>(ctx->bytes));
    delete ctx;  // frees the inner DataPtr
  }
  c10::Allocator* base_;
  mutable std::atomic<std::int64_t> live_{0}, peak_{0};
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 32, width = 256, batch = 4096, reps = 7, warmup = 2;
  CLI::App app("activation checkpointing: time and memory against the expected trade-off");
  app.add_option("--layers", layers);
  app.add_option("--width", width);
  app.add_option("--batch", batch);
  app.add_option("--reps", reps);
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);
  static CountingAllocator counting(c10::GetCPUAllocator());
  c10::SetCPUAllocator(&counting, /*priority=*/100);

  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int l = 0; l < layers; ++l) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::Tanh());
  }
  auto x = torch::randn({batch, width});
  const int root = static_cast<int>(std::lround(std::sqrt(layers)));
  struct Mode {
    std::string name;
    int segments;  // 0: no checkpointing
  };
  const std::vector<Mode> modes{{"plain", 0}, {fmt::format("sqrt(L) = {} segments", root), root},
                                {fmt::format("L/2 = {} segments", layers / 2), layers / 2}};
  fmt::print("MLP of {} Linear+Tanh blocks, width {}, batch {}, 1 thread; median of {} steps after {} warm-up\n",
             layers, width, batch, reps, warmup);
  fmt::print("{:24} {:>10} {:>8} {:>14} {:>8}\n", "mode", "step ms", "x plain", "peak MB", "x plain");
  double plain_ms = 0, plain_mb = 0;
  for (const auto& mode : modes) {
    std::vector<double> times;
    std::int64_t peak = 0;
    for (int r = 0; r < warmup + reps; ++r) {
      model->zero_grad(/*set_to_none=*/true);
      counting.reset_peak();
      const auto before = counting.live();
      const auto t0 = std::chrono::steady_clock::now();
      auto y = mode.segments ? cohort::recompute::checkpoint_sequential(model, mode.segments, x) : model->forward(x);
      y.pow(2).mean().backward();
      const auto t1 = std::chrono::steady_clock::now();
      if (r >= warmup) {
        times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        peak = std::max(peak, counting.peak() - before);
      }
    }
    const double ms = median(times), mb = static_cast<double>(peak) / (1 << 20);
    if (mode.segments == 0) plain_ms = ms, plain_mb = mb;
    fmt::print("{:24} {:10.1f} {:8.2f} {:14.1f} {:8.2f}\n", mode.name, ms, ms / plain_ms, mb, mb / plain_mb);
  }
  fmt::print("peak MB: the most bytes LibTorch's CPU allocator held during a step beyond what it held before it "
             "(activations, gradients, temporaries); each block holds 2 activations of {:.1f} MB\n",
             static_cast<double>(batch) * width * 4 / (1 << 20));
  return 0;
}
