// Activation checkpointing under cohort's DDP, started by multiproc/recompute_test.cpp
// through `cohort run`: each rank trains its half of every batch with its model cut
// into checkpointed segments, and compares the weights with one process training the
// whole batch without checkpointing. With find_unused_parameters, DDP must find the
// parameters behind the checkpoints' autograd nodes (Note [Parameters as inputs]);
// every gradient must arrive once. Prints "recompute <variant> ok" or "... FAILED".
//   recompute_worker sequential | sequential_unused | function
#include <torch/torch.h>

#include <iostream>
#include <string>

#include "cohort/comm/world.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/recompute/checkpoint.h"

namespace {

constexpr int kRows = 6, kSteps = 4;

torch::nn::Sequential make_model() {
  torch::manual_seed(17);
  torch::nn::Sequential m(torch::nn::Linear(5, 12), torch::nn::Tanh(), torch::nn::Linear(12, 12), torch::nn::ReLU(),
                          torch::nn::Linear(12, 12), torch::nn::Tanh(), torch::nn::Linear(12, 3));
  m->to(torch::kDouble);
  return m;
}

std::pair<torch::Tensor, torch::Tensor> batch(int step, int world) {
  auto gen = at::detail::createCPUGenerator(300 + step);
  return {at::randn({kRows * world, 5}, gen, torch::kDouble), at::randint(0, 3, {kRows * world}, gen, torch::kLong)};
}

int run(const std::string& variant) {
  auto world = cohort::comm::World::init();
  const int rank = world.rank(), size = world.size();
  auto model = make_model();
  cohort::ddp::DistributedDataParallel<torch::nn::Sequential> ddp(
      model, world.group(),
      cohort::ddp::DistributedDataParallelOptions().find_unused_parameters(variant == "sequential_unused"));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto reference = make_model();
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = batch(step, size);
    auto mine = torch::indexing::Slice(rank * kRows, (rank + 1) * kRows);
    auto xs = x.index({mine});
    opt.zero_grad();
    ddp.before_forward({xs});
    torch::Tensor out;
    if (variant == "function") {
      // The whole model as one checkpointed function, its parameters given.
      out = cohort::recompute::checkpoint(
          [&](const cohort::recompute::TensorList& in) { return cohort::recompute::TensorList{model->forward(in[0])}; },
          {xs}, cohort::recompute::CheckpointOptions().modules({model.ptr()}))[0];
    } else {
      out = cohort::recompute::checkpoint_sequential(model, 3, xs);
    }
    ddp.after_forward({out});
    torch::nn::functional::cross_entropy(out, y.index({mine})).backward();
    opt.step();
    ref_opt.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
    ref_opt.step();
  }
  double diff = 0;
  for (std::size_t i = 0; i < model->parameters().size(); ++i)
    diff = std::max(diff, (model->parameters()[i] - reference->parameters()[i]).abs().max().item<double>());
  const bool ok = diff < 1e-12;
  std::cout << "recompute " << variant << (ok ? " ok" : " FAILED") << " rank " << rank << " max_param_diff " << diff
            << std::endl;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc > 1 ? argv[1] : "sequential");
  } catch (const std::exception& e) {
    std::cerr << "recompute_worker: " << e.what() << std::endl;
    return 1;
  }
}
