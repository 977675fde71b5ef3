// Training throughput, overlap and memory of cohort's DistributedDataParallel, one
// process per rank under `cohort run`. compare_ddp.sh runs it beside ddp_peer.py
// (PyTorch's own DDP) with the same models (bench_models.h) and the same protocol:
//
//   ddp_bench throughput [--model mlp|cnn|deep|wide|all] [--mode local|ddp|ddp-view] [--steps K] [--reps R]
//                        [--warmup W] [--device cpu|cuda]
//       W warm-up steps, then R repetitions of K steps with a barrier before each;
//       the result is the median over repetitions of steps per second (and of the
//       process's CPU time per step). On cuda (the rank's GPU, world.device()) each
//       repetition ends when the GPU has finished its steps.
//   ddp_bench overlap [--model deep] [--steps N] [--warmup W]
//       With record_timings(true): per bucket, when it became ready, was launched and
//       was done, relative to the end of backward (medians over N steps).
//   ddp_bench memory --mode local|ddp|ddp-view [--model deep] [--steps N] [--warmup W]
//       Peak RSS of this process, over the whole run and over the N steps after the
//       warm-up (which covers the first backward and the bucket rebuild).
//
// Every rank measures; rank 0 prints one JSON line per result. One thread per rank
// (torch::set_num_threads(1)); the batch is made once and reused, so no data loading
// is timed. "local" is plain LibTorch, but the process still joins the world, so it
// carries the same libraries and process group as a DDP run.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_models.h"
#include "process_memory.h"
#include "cohort/comm/world.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/elastic/error_file.h"
#include "cohort/trace/world_timeline.h"

namespace {

using cohort::bench::ModelSpec;
using cohort::comm::World;
using cohort::ddp::DistributedDataParallel;
using cohort::ddp::DistributedDataParallelOptions;
using Json = nlohmann::ordered_json;

struct Args {
  std::string model;         // default: all (throughput), deep (overlap, memory)
  std::string mode = "ddp";  // local | ddp | ddp-view
  int steps = 0;             // default: the model's own (throughput), 30 (overlap, memory)
  int reps = 7;
  int warmup = 10;
  std::int64_t batch = 0;    // overlap: 0 keeps the model's own batch size
  std::string device = "cpu";  // throughput: cpu, or cuda (the world's device)
};

// A model, its optimizer and its batch, with or without DDP around the model.
struct Trainer {
  torch::nn::Sequential model;
  std::unique_ptr<DistributedDataParallel<torch::nn::Sequential>> ddp;
  std::unique_ptr<torch::optim::SGD> optimizer;
  cohort::bench::Batch batch;

  // The same step as ddp_peer.py: zero the gradients (not None), forward, cross
  // entropy, backward, SGD(lr=0.01). Module::zero_grad zeroes in place, like
  // zero_grad(set_to_none=False) on the Python side.
  void step() {
    model->zero_grad();
    auto output = ddp ? (*ddp)(batch.input) : model->forward(batch.input);
    torch::nn::functional::cross_entropy(output, batch.target).backward();
    optimizer->step();
  }
};

Trainer make_trainer(const ModelSpec& spec, const std::string& mode, World& world, bool record_timings = false,
                     c10::Device device = c10::kCPU) {
  Trainer t;
  t.model = cohort::bench::make_model(spec.name);
  t.model->to(device);
  if (mode != "local")
    t.ddp = std::make_unique<DistributedDataParallel<torch::nn::Sequential>>(
        t.model, world.group(),
        DistributedDataParallelOptions()
            .bucket_cap_bytes(spec.bucket_cap_mb << 20)
            .gradient_as_bucket_view(mode == "ddp-view")
            .record_timings(record_timings));
  t.optimizer = std::make_unique<torch::optim::SGD>(t.model->parameters(), torch::optim::SGDOptions(0.01));
  t.batch = cohort::bench::make_batch(spec, world.rank());
  t.batch.input = t.batch.input.to(device);
  t.batch.target = t.batch.target.to(device);
  return t;
}

double round_to(double x, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(x * scale) / scale + 0.0;  // + 0.0: no "-0.0" in the output
}

template <typename T>
T median(std::vector<T> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

// CPU time of the whole process (every thread, Gloo's included), in seconds. Less
// disturbed than wall time by other programs competing for the cores.
double process_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

std::vector<ModelSpec> selected(const std::string& model) {
  if (model == "all") return cohort::bench::model_specs();
  return {cohort::bench::model_spec(model)};
}

int throughput(const Args& a, World& world) {
  const c10::Device device = a.device == "cuda" ? world.device() : c10::Device(c10::kCPU);
  if (a.device == "cuda" && !device.is_cuda())
    throw std::invalid_argument("--device cuda needs a GPU per local rank (the world's device is " + device.str() +
                                ")");
  // Work queued on the GPU counts in the step that queued it.
  auto finish = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  for (const auto& spec : selected(a.model)) {
    auto trainer = make_trainer(spec, a.mode, world, false, device);
    const int steps = a.steps > 0 ? a.steps : spec.steps;
    for (int i = 0; i < a.warmup; ++i) trainer.step();
    finish();
    std::vector<double> rates, cpu_ms;
    for (int r = 0; r < a.reps; ++r) {
      world.group().barrier();
      auto start = std::chrono::steady_clock::now();
      const double cpu_start = process_cpu_s();
      for (int i = 0; i < steps; ++i) trainer.step();
      finish();
      std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      rates.push_back(steps / took.count());
      cpu_ms.push_back((process_cpu_s() - cpu_start) * 1e3 / steps);
    }
    if (world.rank() != 0) continue;
    Json line = {{"impl", a.mode == "local" ? "local" : "cohort-" + a.mode},
                 {"model", spec.name},
                 {"world", world.size()},
                 {"device", device.str()},
                 {"batch", spec.batch},
                 {"steps", steps},
                 {"reps", a.reps},
                 {"bucket_cap_mb", spec.bucket_cap_mb}};
    if (trainer.ddp) line["buckets"] = trainer.ddp->reducer().plan().buckets.size();
    line["steps_per_s"] = round_to(median(rates), 2);
    line["min"] = round_to(*std::min_element(rates.begin(), rates.end()), 2);
    line["max"] = round_to(*std::max_element(rates.begin(), rates.end()), 2);
    line["cpu_ms_per_step"] = round_to(median(cpu_ms), 3);
    std::cout << line.dump() << std::endl;
  }
  return 0;
}

// DDP's overhead at world 1, measured in one process: repetitions of local and DDP
// training alternate (local, ddp, local, ddp, ...), so drift of the machine (other
// load, frequency) hits both alike. Reports the median over pairs of ddp/local time.
int overhead(const Args& a, World& world) {
  for (const auto& spec : selected(a.model)) {
    auto local = make_trainer(spec, "local", world);
    auto ddp = make_trainer(spec, "ddp", world);
    const int steps = a.steps > 0 ? a.steps : spec.steps;
    for (int i = 0; i < a.warmup; ++i) local.step(), ddp.step();
    auto timed = [&](Trainer& t) {
      auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < steps; ++i) t.step();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    std::vector<double> ratios;
    for (int r = 0; r < a.reps; ++r) {
      const double t_local = timed(local);
      ratios.push_back(timed(ddp) / t_local);
    }
    if (world.rank() != 0) continue;
    std::cout << Json{{"impl", "cohort-ddp"},
                      {"kind", "overhead"},
                      {"model", spec.name},
                      {"world", world.size()},
                      {"steps", steps},
                      {"reps", a.reps},
                      {"overhead_pct", round_to((median(ratios) - 1) * 100, 2)},
                      {"min_pct", round_to((*std::min_element(ratios.begin(), ratios.end()) - 1) * 100, 2)},
                      {"max_pct", round_to((*std::max_element(ratios.begin(), ratios.end()) - 1) * 100, 2)}}
                     .dump()
              << std::endl;
  }
  return 0;
}

int overlap(const Args& a, World& world) {
  auto spec = cohort::bench::model_spec(a.model);
  if (a.batch > 0) spec.batch = a.batch;
  auto trainer = make_trainer(spec, "ddp", world, /*record_timings=*/true);
  for (int i = 0; i < a.warmup; ++i) trainer.step();
  world.group().barrier();
  std::vector<cohort::ddp::IterationTimings> seen;
  for (int i = 0; i < a.steps; ++i) {
    trainer.step();
    seen.push_back(trainer.ddp->last_timings());
  }
  if (world.rank() != 0) return 0;

  // Milliseconds relative to the end of backward: negative is hidden behind it.
  auto relative_ms = [&](std::size_t b, double cohort::ddp::BucketTiming::*field) {
    std::vector<double> ms;
    for (const auto& t : seen) ms.push_back((t.buckets[b].*field - t.backward_end_s) * 1e3);
    return round_to(median(ms), 2);
  };
  const auto buckets = seen.front().buckets.size();
  for (std::size_t b = 0; b < buckets; ++b)
    std::cout << Json{{"impl", "cohort-ddp"},
                      {"kind", "overlap"},
                      {"model", spec.name},
                      {"world", world.size()},
                      {"batch", spec.batch},
                      {"bucket", b},
                      {"mb", round_to(seen.front().buckets[b].bytes / double(1 << 20), 2)},
                      {"ready_ms", relative_ms(b, &cohort::ddp::BucketTiming::ready_s)},
                      {"launched_ms", relative_ms(b, &cohort::ddp::BucketTiming::launched_s)},
                      {"done_ms", relative_ms(b, &cohort::ddp::BucketTiming::done_s)}}
                     .dump()
              << std::endl;
  std::vector<double> hidden, backward_ms, wait_ms;
  for (const auto& t : seen) {
    hidden.push_back(t.hidden_fraction());
    backward_ms.push_back(t.backward_end_s * 1e3);
    wait_ms.push_back((t.finalize_end_s - t.backward_end_s) * 1e3);
  }
  std::cout << Json{{"impl", "cohort-ddp"},
                    {"kind", "overlap-summary"},
                    {"model", spec.name},
                    {"world", world.size()},
                    {"batch", spec.batch},
                    {"steps", a.steps},
                    {"buckets", buckets},
                    {"backward_ms", round_to(median(backward_ms), 2)},
                    {"wait_after_backward_ms", round_to(median(wait_ms), 2)},
                    {"hidden_fraction", round_to(median(hidden), 3)},
                    {"hidden_min", round_to(*std::min_element(hidden.begin(), hidden.end()), 3)},
                    {"hidden_max", round_to(*std::max_element(hidden.begin(), hidden.end()), 3)}}
                   .dump()
            << std::endl;
  return 0;
}

using cohort::bench::reset_peak_rss;
using cohort::bench::status_mb;

int memory(const Args& a, World& world) {
  const auto& spec = cohort::bench::model_spec(a.model);
  auto trainer = make_trainer(spec, a.mode, world);
  for (int i = 0; i < a.warmup; ++i) trainer.step();
  const double warmup_peak = status_mb("VmHWM");
  const bool reset = reset_peak_rss();
  for (int i = 0; i < a.steps; ++i) trainer.step();
  const double steady_peak = status_mb("VmHWM");
  if (world.rank() != 0) return 0;
  Json line = {{"impl", "cohort"},
               {"kind", "memory"},
               {"config", a.mode},
               {"model", spec.name},
               {"world", world.size()},
               {"grad_mb", round_to(cohort::bench::gradient_mb(*trainer.model), 2)},
               {"peak_mb", round_to(std::max(warmup_peak, steady_peak), 2)},
               {"steady_peak_mb", reset ? Json(round_to(steady_peak, 2)) : Json()},
               {"rss_mb", round_to(status_mb("VmRSS"), 2)}};
  std::cout << line.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cohort DDP benchmark: throughput, overlap and memory (see BENCHMARKS.md)"};
  app.require_subcommand(1);
  Args a;
  auto common = [&a](CLI::App* sub) {
    sub->add_option("--model", a.model, "mlp, cnn, deep, wide, or all (throughput only; all is the first three)")
        ->check(CLI::IsMember({"mlp", "cnn", "deep", "wide", "all"}));
    sub->add_option("--steps", a.steps, "steps per repetition (throughput, 0: the model's default) or measured");
    sub->add_option("--warmup", a.warmup, "steps before measuring");
  };
  auto* tput = app.add_subcommand("throughput", "steps per second, median over repetitions");
  common(tput);
  tput->add_option("--mode", a.mode)->check(CLI::IsMember({"local", "ddp", "ddp-view"}));
  tput->add_option("--reps", a.reps, "repetitions")->check(CLI::PositiveNumber);
  tput->add_option("--device", a.device, "cpu, or cuda: the rank's GPU (needs NCCL's one GPU per local rank)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  auto* ovh = app.add_subcommand("overhead", "DDP against local training in one process, alternating");
  common(ovh);
  ovh->add_option("--reps", a.reps, "pairs of repetitions")->check(CLI::PositiveNumber);
  auto* ovl = app.add_subcommand("overlap", "per-bucket timings relative to the end of backward");
  common(ovl);
  ovl->add_option("--batch", a.batch, "batch size (default: the model's own)")->check(CLI::PositiveNumber);
  auto* mem = app.add_subcommand("memory", "peak RSS after training steps");
  common(mem);
  mem->add_option("--mode", a.mode)->required()->check(CLI::IsMember({"local", "ddp", "ddp-view"}));
  CLI11_PARSE(app, argc, argv);
  const bool per_model = tput->parsed() || ovh->parsed();
  if (a.model.empty()) a.model = per_model ? "all" : "deep";
  if (a.steps <= 0 && !per_model) a.steps = 30;

  return cohort::elastic::record([&] {
    torch::set_num_threads(1);
    auto world = World::init(cohort::trace::traced());
    if (tput->parsed()) return throughput(a, world);
    if (ovh->parsed()) return overhead(a, world);
    if (ovl->parsed()) return overlap(a, world);
    return memory(a, world);
  });
}
