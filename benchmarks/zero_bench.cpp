// DDP against ZeRO-1, ZeRO-2 and ZeRO-3 (docs/zero.md), one process per rank under
// `cohort run`: memory per rank (compare_zero_memory.sh, worlds 2 and 4) and step
// time (compare_zero_throughput.sh, beside PyTorch's ZeroRedundancyOptimizer and
// FSDP in benchmarks/zero_peer.py).
//
//   zero_bench memory --mode MODE [--width W] [--layers L] [--steps K] [--bucket-mib B]
//   zero_bench throughput --mode MODE [--width W] [--layers L] [--batch N]
//              [--steps K] [--reps R] [--warmup U] [--bucket-mib B]
//
//   MODE  ddp            DistributedDataParallel, Adam on every rank
//         zero1          DDP, Adam's state sharded (ShardedOptimizer)
//         zero2          gradients and Adam's state sharded (ShardedOptimizer)
//         zero3          parameters too (zero::fully_shard): each linear layer a unit,
//                        the model the root unit, FULL_SHARD (reshard_after_forward)
//         zero3-grad-op  zero3 keeping each unit gathered from its forward to its
//                        backward (reshard_after_forward(false): SHARD_GRAD_OP)
//
// The model is L linear layers of W x W (default 5 x 2048: 21.0M parameters, 84 MB
// in float32), trained with Adam on one random batch.
//
// memory: K steps (default 3). After the last backward (before its step) each rank
// counts the bytes of its parameters (ZeRO-3's shards alone: no unit is gathered
// then), of the gradients it holds (DDP's buckets, as .grad aliases them with
// gradient_as_bucket_view; ZeRO-3's sharded gradients), and of its optimizer state
// after the step; and its peak RSS over the steps, beside its RSS before the model
// existed. Rank 0 prints one JSON
// line per rank, with the ZeRO paper's per-rank formulas in float32 terms: DDP
// (4+4+K)Ψ, ZeRO-1 4Ψ+4Ψ+KΨ/N, ZeRO-2 4Ψ+(4+K)Ψ/N, ZeRO-3 (4+4+K)Ψ/N, with K = 8
// bytes of Adam state per parameter. (The paper counts mixed precision: 2Ψ of
// float16 parameters and gradients, K = 12 for float32 master weights and moments.)
// B sizes the gradient buckets of DDP and ZeRO-2 (default 25 MiB, both's default):
// ZeRO-2's gradients in transit take about three buckets (Note [ZeRO-2 gradients]).
//
// throughput: U warm-up steps, then R repetitions of K steps, each timed whole
// (zero_grad, forward, backward, step) after a barrier; rank 0 prints one JSON line
// with the median and spread of the repetitions' milliseconds per step, the
// slowest rank's (the step time the job sees).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/comm/world.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/elastic/error_file.h"
#include "cohort/zero/fully_shard.h"
#include "cohort/zero/fully_sharded_optimizer.h"
#include "cohort/zero/sharded_optimizer.h"
#include "cohort/zero/state_bytes.h"
#include "process_memory.h"

namespace {

using cohort::bench::status_mb;
using Json = nlohmann::ordered_json;

struct Args {
  std::string command = "memory";
  std::string mode = "ddp";
  std::int64_t width = 2048;
  int layers = 5;
  int steps = 3;
  std::int64_t bucket_mib = 25;
  std::int64_t batch = 16;
  int reps = 7;
  int warmup = 3;
};

torch::nn::Sequential make_model(const Args& a) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int i = 0; i < a.layers; ++i) {
    model->push_back(torch::nn::Linear(a.width, a.width));
    if (i + 1 < a.layers) model->push_back(torch::nn::ReLU());
  }
  return model;
}

// zero3's model: make_model's linear layers, the same modules with the same values,
// each a ZeRO-3 unit. A unit's forward is a template, which torch::nn::Sequential
// cannot call, so this calls them in turn, with make_model's ReLU between.
struct UnitsImpl : torch::nn::Module {
  explicit UnitsImpl(const torch::nn::Sequential& model) {
    for (const auto& child : model->children())
      if (auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(child)) {
        cohort::zero::FullyShard<torch::nn::LinearImpl> unit(linear);
        layers.push_back(unit);
        register_module("layer" + std::to_string(layers.size() - 1), unit);
      }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (std::size_t i = 0; i < layers.size(); ++i) {
      x = layers[i](x);
      if (i + 1 < layers.size()) x = torch::relu(x);
    }
    return x;
  }
  std::vector<cohort::zero::FullyShard<torch::nn::LinearImpl>> layers;
};

std::int64_t bytes_of(const std::vector<torch::Tensor>& tensors, bool grads) {
  std::int64_t n = 0;
  for (const auto& t : tensors) {
    const auto& x = grads ? t.grad() : t;
    if (x.defined()) n += static_cast<std::int64_t>(x.nbytes());
  }
  return n;
}

// What a rank holds after a backward, before the step.
struct Held {
  std::int64_t parameter_bytes = 0;
  std::int64_t gradient_bytes = 0;
};

// The model, under DDP (ddp, zero1), alone (zero2) or fully sharded (zero3,
// zero3-grad-op: then `model` is empty, its layers moved into `root`), and its
// optimizer.
struct Setup {
  torch::nn::Sequential model;
  std::optional<cohort::ddp::DistributedDataParallel<torch::nn::Sequential>> ddp;
  cohort::zero::FullyShard<UnitsImpl> root{nullptr};
  std::optional<cohort::zero::FullyShardedModel> sharded;
  std::unique_ptr<torch::optim::Optimizer> optimizer;

  Setup(const Args& a, cohort::comm::World& world) : model(make_model(a)) {
    auto adam = [](std::vector<torch::Tensor> p) {
      return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-4));
    };
    if (a.mode == "zero3" || a.mode == "zero3-grad-op") {
      root = cohort::zero::FullyShard<UnitsImpl>(std::make_shared<UnitsImpl>(model));
      // The layers are the units' now; their parameters, freed in place between
      // steps, would read through the Sequential as a model of no elements.
      model = torch::nn::Sequential();
      sharded.emplace(cohort::zero::fully_shard(
          root, world.group(), cohort::zero::FullyShardOptions().reshard_after_forward(a.mode == "zero3")));
      optimizer = std::make_unique<cohort::zero::FullyShardedOptimizer>(*sharded, adam);
    } else if (a.mode == "zero2") {
      optimizer = std::make_unique<cohort::zero::ShardedOptimizer>(
          model->parameters(), world.group(), adam,
          cohort::zero::ShardedOptimizerOptions().shard_gradients(true).bucket_cap_bytes(a.bucket_mib << 20));
    } else {
      ddp.emplace(model, world.group(),
                  cohort::ddp::DistributedDataParallelOptions().gradient_as_bucket_view(true).bucket_cap_bytes(
                      a.bucket_mib << 20));
      if (a.mode == "zero1")
        optimizer = std::make_unique<cohort::zero::ShardedOptimizer>(model->parameters(), world.group(), adam);
      else
        optimizer = adam(model->parameters());
    }
  }
  // One whole step; what was held after its backward.
  Held step(const torch::Tensor& x) {
    optimizer->zero_grad();
    (sharded ? root(x) : ddp ? (*ddp)(x) : model->forward(x)).square().mean().backward();
    Held held;
    if (sharded) {
      held = {sharded->local_parameter_bytes(), sharded->local_gradient_bytes()};
    } else {
      held = {bytes_of(model->parameters(), false), bytes_of(model->parameters(), /*grads=*/true)};
    }
    optimizer->step();
    return held;
  }
  // The model's parameters (Psi), whoever holds them.
  std::int64_t parameter_count() const {
    if (sharded) return sharded->total_parameters();
    std::int64_t n = 0;
    for (const auto& p : model->parameters()) n += p.numel();
    return n;
  }
};

int throughput(const Args& a, cohort::comm::World& world) {
  torch::set_num_threads(1);
  Setup setup(a, world);
  const auto x = torch::randn({a.batch, a.width});
  for (int s = 0; s < a.warmup; ++s) setup.step(x);
  std::vector<double> ms;
  for (int r = 0; r < a.reps; ++r) {
    world.group().barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int s = 0; s < a.steps; ++s) setup.step(x);
    auto t = torch::tensor(
        {std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / a.steps},
        torch::kDouble);
    world.group().all_reduce(t, cohort::comm::ReduceOp::kMax);
    ms.push_back(t.item<double>());
  }
  if (world.rank() != 0) return 0;
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  std::cout << Json{{"peer", "cohort"},
                    {"mode", a.mode},
                    {"world", world.size()},
                    {"parameters_million", static_cast<double>(setup.parameter_count()) / 1e6},
                    {"batch_per_rank", a.batch},
                    {"steps_per_rep", a.steps},
                    {"reps", a.reps},
                    {"step_ms_median", median},
                    {"step_ms_min", ms.front()},
                    {"step_ms_max", ms.back()},
                    {"samples_per_s", static_cast<double>(a.batch * world.size()) * 1000.0 / median}}
                   .dump()
            << std::endl;
  return 0;
}

int memory(const Args& a, cohort::comm::World& world) {
  torch::set_num_threads(1);
  const double rss_before_mb = status_mb("VmRSS");
  Setup setup(a, world);
  const auto x = torch::randn({a.batch, a.width});
  Held held;
  for (int s = 0; s < a.steps; ++s) held = setup.step(x);
  const double psi = static_cast<double>(setup.parameter_count());  // float32, 4 bytes each
  // The state of the optimizer that steps: a wrapper's own state() is empty.
  const auto* optimizer = setup.optimizer.get();
  std::int64_t state = 0;
  if (const auto* z = dynamic_cast<const cohort::zero::ShardedOptimizer*>(optimizer))
    state = z->local_state_bytes();
  else if (const auto* z3 = dynamic_cast<const cohort::zero::FullyShardedOptimizer*>(optimizer))
    state = z3->local_state_bytes();
  else
    state = cohort::zero::optimizer_state_bytes(*optimizer);
  const double n = world.size(), k = 8;
  auto mine = torch::tensor({static_cast<double>(held.parameter_bytes), static_cast<double>(held.gradient_bytes),
                             static_cast<double>(state), status_mb("VmHWM"), rss_before_mb},
                            torch::kDouble);
  auto all = world.group().all_gather(mine);
  if (world.rank() != 0) return 0;
  const double mib = 1024.0 * 1024.0;
  for (int r = 0; r < world.size(); ++r) {
    auto v = all[static_cast<std::size_t>(r)];
    std::cout << Json{{"mode", a.mode},
                      {"world", world.size()},
                      {"bucket_mib", a.bucket_mib},
                      {"rank", r},
                      {"parameters_million", psi / 1e6},
                      {"parameter_mib", v[0].item<double>() / mib},
                      {"gradient_mib", v[1].item<double>() / mib},
                      {"optimizer_state_mib", v[2].item<double>() / mib},
                      {"tensor_total_mib", (v[0].item<double>() + v[1].item<double>() + v[2].item<double>()) / mib},
                      {"formula_mib",
                       {{"ddp", (4 + 4 + k) * psi / mib},
                        {"zero1", (4 + 4 + k / n) * psi / mib},
                        {"zero2", (4 + (4 + k) / n) * psi / mib},
                        {"zero3", (4 + 4 + k) / n * psi / mib},
                        // SHARD_GRAD_OP holds the same between steps; it differs in
                        // the gathered units during forward and backward (peak RSS).
                        {"zero3-grad-op", (4 + 4 + k) / n * psi / mib}}},
                      {"peak_rss_mib", v[3].item<double>()},
                      {"rss_before_model_mib", v[4].item<double>()}}
                     .dump()
              << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cohort::elastic::record([&] {
    Args a;
    CLI::App app("DDP against ZeRO-1, ZeRO-2 and ZeRO-3: memory per rank and step time");
    app.add_option("command", a.command, "memory or throughput")
        ->required()
        ->check(CLI::IsMember({"memory", "throughput"}));
    app.add_option("--mode", a.mode, "ddp, zero1, zero2, zero3 or zero3-grad-op")
        ->check(CLI::IsMember({"ddp", "zero1", "zero2", "zero3", "zero3-grad-op"}));
    app.add_option("--width", a.width, "features of each linear layer")->check(CLI::Range(1, 1 << 16));
    app.add_option("--layers", a.layers, "linear layers")->check(CLI::Range(1, 64));
    app.add_option("--steps", a.steps, "training steps (memory), or steps per timed repetition (throughput)")
        ->check(CLI::Range(1, 1000));
    app.add_option("--bucket-mib", a.bucket_mib, "gradient bucket cap of DDP and ZeRO-2, MiB")
        ->check(CLI::Range(1, 1024));
    app.add_option("--batch", a.batch, "samples per rank and step")->check(CLI::Range(1, 1 << 16));
    app.add_option("--reps", a.reps, "timed repetitions (throughput)")->check(CLI::Range(1, 1000));
    app.add_option("--warmup", a.warmup, "untimed steps first (throughput)")->check(CLI::Range(0, 1000));
    CLI11_PARSE(app, argc, argv);
    auto world = cohort::comm::World::init();
    return a.command == "memory" ? memory(a, world) : throughput(a, world);
  });
}
