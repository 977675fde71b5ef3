// GradScaler across real processes, started by tests/multiproc/amp_test.cpp through
// `cohort run`. The model is under cohort's DDP; at step 1, after DDP has averaged
// the gradients, rank 1 alone writes an inf into one of its gradients. Only the
// scaler's all-reduce of the found-inf flag (Note [Agreeing on overflow]) can make
// rank 0 skip too. Each rank checks that both skipped step 1 and no other, that the
// scale backed off and grew back identically everywhere, and, where the gradients
// are exact, that the weights equal one process on the whole batch that skipped the
// same step. Prints "amp <variant> ok" or "amp <variant> FAILED (...)" and exits 1.
//   amp_worker plain | no_sync | fp16_hook
#include <torch/torch.h>

#include <iostream>
#include <limits>
#include <string>

#include "cohort/amp/grad_scaler.h"
#include "cohort/comm/world.h"
#include "cohort/ddp/comm_hook.h"
#include "cohort/ddp/distributed_data_parallel.h"

namespace {

constexpr int kRows = 8, kSteps = 5, kSkipped = 1;

torch::nn::Sequential make_model() {
  torch::manual_seed(5);
  torch::nn::Sequential m(torch::nn::Linear(6, 10), torch::nn::Tanh(), torch::nn::Linear(10, 3));
  m->to(torch::kDouble);
  return m;
}

std::pair<torch::Tensor, torch::Tensor> batch(int step, int world) {
  auto gen = at::detail::createCPUGenerator(200 + step);
  return {at::randn({kRows * world, 6}, gen, torch::kDouble), at::randint(0, 3, {kRows * world}, gen, torch::kLong)};
}

torch::Tensor loss_of(torch::nn::Sequential& m, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(m->forward(x), y);
}

int run(const std::string& variant) {
  auto world = cohort::comm::World::init();
  const int rank = world.rank(), size = world.size();
  auto options = cohort::ddp::DistributedDataParallelOptions();
  if (variant == "fp16_hook") options.comm_hook(cohort::ddp::fp16_compress_hook());
  auto model = make_model();
  cohort::ddp::DistributedDataParallel<torch::nn::Sequential> ddp(model, world.group(), options);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  cohort::amp::GradScaler scaler(cohort::amp::GradScalerOptions().growth_interval(2), world.group());

  auto reference = make_model();
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));

  std::string problems;
  std::vector<double> scales;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = batch(step, size);
    auto mine = torch::indexing::Slice(rank * kRows, (rank + 1) * kRows);
    auto xs = x.index({mine}), ys = y.index({mine});
    opt.zero_grad();
    if (variant == "no_sync") {
      // Two half batches: the first accumulates locally, the second reduces.
      const auto half = kRows / 2;
      {
        auto guard = ddp.no_sync();
        auto first = torch::indexing::Slice(0, half);
        scaler.scale(torch::nn::functional::cross_entropy(ddp(xs.index({first})), ys.index({first})) * 0.5).backward();
      }
      auto second = torch::indexing::Slice(half, kRows);
      scaler.scale(torch::nn::functional::cross_entropy(ddp(xs.index({second})), ys.index({second})) * 0.5).backward();
    } else {
      scaler.scale(torch::nn::functional::cross_entropy(ddp(xs), ys)).backward();
    }
    if (step == kSkipped && rank == 1)
      model->parameters()[2].mutable_grad()[0][0] = std::numeric_limits<double>::infinity();
    std::vector<torch::Tensor> before;
    for (auto& p : model->parameters()) before.push_back(p.detach().clone());
    const bool stepped = scaler.step(opt);
    scaler.update();
    scales.push_back(scaler.get_scale());
    if (stepped != (step != kSkipped)) problems += " step " + std::to_string(step) + (stepped ? " stepped" : " skipped");
    if (!stepped)
      for (std::size_t i = 0; i < before.size(); ++i)
        if (!torch::equal(before[i], model->parameters()[i])) problems += " skipped step changed weights;";

    if (step != kSkipped) {
      ref_opt.zero_grad();
      loss_of(reference, x, y).backward();
      ref_opt.step();
    }
  }
  // 65536, then the backoff at step 1, then growth after every 2 clean steps.
  const std::vector<double> expected{65536, 32768, 32768, 65536, 65536};
  if (scales != expected) problems += " scales differ from 65536,32768,32768,65536,65536;";
  // Every rank holds the same weights and the same scale.
  std::vector<torch::Tensor> flat;
  for (auto& p : model->parameters()) flat.push_back(p.detach().flatten());
  flat.push_back(torch::tensor({scaler.get_scale()}, torch::kDouble));
  auto mine_all = torch::cat(flat);
  auto gathered = world.group().all_gather(mine_all);
  for (int r = 1; r < size; ++r)
    if (!torch::equal(gathered[r], gathered[0])) problems += " rank " + std::to_string(r) + " differs from rank 0;";
  double diff = 0;
  for (std::size_t i = 0; i < model->parameters().size(); ++i)
    diff = std::max(diff, (model->parameters()[i] - reference->parameters()[i]).abs().max().item<double>());
  // The fp16 hook rounds the averaged gradients to float16 on the wire.
  const double tolerance = variant == "fp16_hook" ? 1e-2 : 1e-12;
  if (!(diff < tolerance)) problems += " weights differ from the reference by " + std::to_string(diff) + ";";
  std::cout << "amp " << variant << (problems.empty() ? " ok" : " FAILED (" + problems + ")") << " rank " << rank
            << " max_param_diff " << diff << std::endl;
  return problems.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc > 1 ? argv[1] : "plain");
  } catch (const std::exception& e) {
    std::cerr << "amp_worker: " << e.what() << std::endl;
    return 1;
  }
}
