#pragma once
// The pieces of tests/multiproc/ddp/ddp_worker.cpp: arguments, the seeded global
// batches, comparisons against the single-process reference, and the scenarios.
#include <torch/torch.h>

#include <iostream>
#include <string>

#include "cohort/comm/world.h"
#include "cohort/ddp/distributed_data_parallel.h"

namespace cohort::testing {

struct WorkerArgs {
  std::string scenario;
  std::string model = "mlp";
  std::string hook = "fp16";
  int steps = 5;
  int micro_steps = 3;
  std::int64_t cap = -1;
  std::int64_t first_cap = -1;
  bool view = false;
  bool find_unused = false;
  bool static_graph = false;
  bool divide_by_initial_world_size = true;
  // Where the DDP model and its batches live; the reference stays on the CPU.
  std::string device = "cpu";
};
WorkerArgs parse_worker_args(int argc, char** argv);
ddp::DistributedDataParallelOptions ddp_options(const WorkerArgs& a);

constexpr int kRowsPerRank = 6;
struct Batch {
  torch::Tensor x, y;
};
// The same on every rank: seeded by the step.
Batch global_batch(int step, int rows);
// Rows [rank * per_rank, (rank + 1) * per_rank).
torch::Tensor rows_of(const torch::Tensor& t, int rank, int per_rank = kRowsPerRank);

// Each parameter once (a shared one is listed twice by parameters()).
std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& m);
torch::optim::SGD make_sgd(const torch::nn::Module& m);
// Largest absolute difference between parameters (and buffers) / gradients of two
// identically built modules; infinity when a gradient is defined in only one.
double max_param_diff(const torch::nn::Module& a, const torch::nn::Module& b);
double max_grad_diff(const torch::nn::Module& a, const torch::nn::Module& b);
// Prints "<scenario> ok rank R ..." and returns 0, or "<scenario> FAILED ..." and 1.
int report(const std::string& scenario, comm::World& world, double param_diff, double grad_diff,
           double tolerance = 1e-5);

inline auto plain_forward() {
  return [](auto& call, const torch::Tensor& x, int /*step*/) { return call(x); };
}

// N SGD steps with DDP on this rank's rows against the reference on all rows.
template <typename Make, typename Forward>
int run_parity(const WorkerArgs& a, comm::World& world, Make make, Forward forward) {
  const int r = world.rank();
  torch::manual_seed(42);
  auto reference = make();
  torch::manual_seed(42);
  const c10::Device device(a.device);
  auto module = make();
  module->to(device);
  ddp::DistributedDataParallel ddp(module, world.group(), ddp_options(a));
  auto ref_opt = make_sgd(*reference);
  auto opt = make_sgd(*ddp.module());
  auto ref_call = [&](auto&&... xs) { return reference->forward(xs...); };
  auto ddp_call = [&](auto&&... xs) { return ddp.forward(xs...); };
  double grad_diff = 0;
  for (int step = 0; step < a.steps; ++step) {
    auto b = global_batch(step, world.size() * kRowsPerRank);
    ref_opt.zero_grad();
    torch::mse_loss(forward(ref_call, b.x, step), b.y).backward();
    opt.zero_grad();
    torch::mse_loss(forward(ddp_call, rows_of(b.x, r).to(device), step), rows_of(b.y, r).to(device)).backward();
    grad_diff = std::max(grad_diff, max_grad_diff(*reference, *ddp.module()));
    ref_opt.step();
    opt.step();
  }
  // CUDA's GEMMs sum in another order than the CPU's: float32 rounding, no more.
  const double tolerance = device.is_cpu() ? 1e-5 : 1e-4;
  return report("parity " + a.model, world, max_param_diff(*reference, *ddp.module()), grad_diff, tolerance);
}

int run_cnn_parity(const WorkerArgs& a, comm::World& world);
int run_no_sync(const WorkerArgs& a, comm::World& world);
int run_hook(const WorkerArgs& a, comm::World& world);
int run_join(const WorkerArgs& a, comm::World& world);
int run_failed_step(const WorkerArgs& a, comm::World& world);

}  // namespace cohort::testing
