// A worker for the timeline, straggler and thread-policy tests, started by
// `cohort run`:
//   trace_worker threads      prints the thread counts it runs with
//   trace_worker train STEPS  trains a small model under DDP, timing each step with
//                             a StepProfiler; rank COHORT_TEST_SLOW_RANK sleeps
//                             COHORT_TEST_SLOW_MS in each step. Rank 0 prints the
//                             straggler report and hands it to the launcher.
#include <dirent.h>
#include <torch/torch.h>

#include <chrono>
#include <iostream>
#include <string>
#include <thread>

#include "cohort/comm/world.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/system/blas.h"
#include "cohort/trace/step_profiler.h"
#include "cohort/trace/straggler.h"
#include "cohort/trace/world_timeline.h"

namespace {

int os_threads() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (auto* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n;
}

int env_int(const cohort::comm::EnvMap& env, const char* name, int fallback) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? fallback : std::stoi(it->second);
}

int threads(cohort::comm::World& world) {
  // A matrix product first, so that the BLAS and OpenMP pools exist.
  auto a = torch::rand({256, 256});
  auto b = torch::mm(a, a);
  const auto t = cohort::system::thread_settings();
  std::cout << "threads rank=" << world.rank() << " intra_op=" << t.intra_op << " blas=" << t.blas
            << " blas_name=" << cohort::system::detect_blas().name << " os_threads=" << os_threads()
            << " sum=" << b.sum().item<double>() * 0 << std::endl;
  return 0;
}

int train(cohort::comm::World& world, int steps) {
  const auto env = cohort::comm::process_environment();
  const int slow_rank = env_int(env, "COHORT_TEST_SLOW_RANK", -1);
  const int slow_ms = env_int(env, "COHORT_TEST_SLOW_MS", 0);
  // In percent (the report's default: 20). Note [Straggler tests on a shared VM] in
  // trace_test.cpp.
  const int threshold_pct = env_int(env, "COHORT_TEST_STRAGGLER_THRESHOLD_PCT", 20);
  torch::manual_seed(0);
  // About 1 GFLOP per step (40-70 ms on one core of CI's VM).
  auto model = torch::nn::Sequential(torch::nn::Linear(256, 1024), torch::nn::ReLU(), torch::nn::Linear(1024, 1024),
                                     torch::nn::ReLU(), torch::nn::Linear(1024, 10));
  cohort::ddp::DistributedDataParallel ddp(
      model, world.group(),
      cohort::ddp::DistributedDataParallelOptions().record_timings(true).bucket_cap_bytes(1 << 20).first_bucket_cap_bytes(256 << 10));
  torch::optim::SGD opt(model->parameters(), 0.01);
  cohort::trace::StepProfiler profiler(cohort::trace::timeline_of(world));
  for (int step = 1; step <= steps; ++step) {
    profiler.begin_step(step);
    torch::Tensor x, y;
    {
      auto p = profiler.phase("data");
      x = torch::randn({128, 256});
      y = torch::randint(10, {128});
      if (world.rank() == slow_rank) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
    }
    torch::Tensor loss;
    {
      auto p = profiler.phase("forward");
      opt.zero_grad();
      loss = torch::nn::functional::cross_entropy(ddp(x), y);
    }
    {
      auto p = profiler.phase("backward");
      loss.backward();
    }
    {
      auto p = profiler.phase("optimizer");
      opt.step();
    }
    const auto& t = ddp.last_timings();
    profiler.end_step(t.finalize_end_s > t.backward_end_s ? t.finalize_end_s - t.backward_end_s : 0);
  }
  auto report = cohort::trace::gather_straggler_report(
      world.group(), world.device(), profiler.work_times().summary(),
      cohort::trace::StragglerOptions().threshold(threshold_pct / 100.0));
  if (world.rank() == 0) {
    const auto text = report.format("straggler report:");
    std::cout << text;
    std::cout << "stragglers:";
    for (int r : report.stragglers()) std::cout << " " << r;
    std::cout << std::endl;
    cohort::trace::report_to_launcher(text, env);
  }
  if (auto timeline = cohort::trace::timeline_of(world)) {
    std::cout << "timeline " << timeline->path() << " events=" << timeline->size()
              << " dropped=" << timeline->dropped() << " overhead_us=" << timeline->overhead_us() << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  auto world = cohort::comm::World::init(cohort::trace::traced());
  if (scenario == "threads") return threads(world);
  if (scenario == "train") return train(world, argc > 2 ? std::stoi(argv[2]) : 20);
  std::cerr << "trace_worker: unknown scenario '" << scenario << "'\n";
  return 2;
}
