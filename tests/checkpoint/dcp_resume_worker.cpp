// Resumes a distributed checkpoint (PyTorch's dcp.save, or cohort's Format::kDcp) in a
// cohort run and trains on, for dcp_convert_test.cpp, under `cohort run`:
//   dcp_resume_worker CKPT_DIR STEPS RESULT.json [--zero] [--save-dcp DIR]
// The model is dcp_resume_check.py's MLP; the global batch of step s is its
// batch(s), each rank its equal share of the rows, under cohort's DDP (or ZeRO-1 with
// --zero). Rank 0 writes the final weights (and, without --zero, Adam's moments) as
// JSON, as dcp_resume_check.py does; --save-dcp saves the result in PyTorch's format.
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/comm/world.h"
#include "cohort/compat/optimizer.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/zero/sharded_optimizer.h"

namespace {

constexpr std::int64_t kRows = 6;  // the global batch: 6 rows, shared by 1, 2 or 3 ranks

// dcp_resume_check.py's batch(step), to the bit: float32 sines and cosines.
std::pair<torch::Tensor, torch::Tensor> batch(std::int64_t step) {
  const double f = 0.1 * static_cast<double>(step + 1);
  auto x = torch::sin(torch::arange(kRows * 5, torch::kFloat) * f).reshape({kRows, 5});
  auto y = torch::cos(torch::arange(kRows * 3, torch::kFloat) * (2 * f)).reshape({kRows, 3});
  return {x, y};
}

std::vector<double> flat(const torch::Tensor& t) {
  auto d = t.detach().to(torch::kDouble).contiguous().reshape({-1});
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

int run(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: dcp_resume_worker CKPT_DIR STEPS RESULT.json [--zero] [--save-dcp DIR]\n";
    return 2;
  }
  bool zero = false;
  std::string save_dcp;
  for (int i = 4; i < argc; ++i) {
    if (std::string(argv[i]) == "--zero") zero = true;
    if (std::string(argv[i]) == "--save-dcp" && i + 1 < argc) save_dcp = argv[++i];
  }
  auto world = cohort::comm::World::init();
  const int rank = world.rank(), size = world.size();
  torch::manual_seed(123);  // any start: the checkpoint replaces it
  torch::nn::Sequential model(torch::nn::Linear(5, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
  cohort::ddp::DistributedDataParallel<torch::nn::Sequential> ddp(model, world.group());
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (zero) {
    opt = std::make_unique<cohort::zero::ShardedOptimizer>(
        model->parameters(), world.group(), [](std::vector<torch::Tensor> p) {
          return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.01));
        });
  } else {
    opt = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.01));
  }
  cohort::checkpoint::Checkpointer ckpt(argv[1], world.group());
  const auto restored = ckpt.load_latest(*model, *opt, torch::kCPU);
  if (!restored) {
    std::cerr << "dcp_resume_worker: no checkpoint in " << argv[1] << "\n";
    return 1;
  }
  const std::int64_t steps = std::stoll(argv[2]);
  const std::int64_t share = kRows / size;
  std::int64_t step = restored->progress.step;
  for (std::int64_t i = 0; i < steps; ++i, ++step) {
    auto [x, y] = batch(step);
    auto mine = torch::indexing::Slice(rank * share, (rank + 1) * share);
    opt->zero_grad();
    auto xs = x.index({mine});
    ddp.before_forward({xs});
    auto out = model->forward(xs);
    ddp.after_forward({out});
    torch::mse_loss(out, y.index({mine})).backward();
    opt->step();
  }
  if (!save_dcp.empty())
    cohort::checkpoint::Checkpointer(save_dcp, world.group(),
                                     cohort::checkpoint::CheckpointerOptions().format(cohort::checkpoint::Format::kDcp))
        .save(*model, *opt, {step, 0, 0, {}}, torch::kCPU);
  if (rank == 0) {
    nlohmann::json result;
    for (const auto& p : model->named_parameters()) {
      result["model." + p.key()] = flat(p.value());
      if (zero) continue;
      const auto it = opt->state().find(cohort::compat::optimizer_state_key(p.value()));
      const auto& s = static_cast<const torch::optim::AdamParamState&>(*it->second);
      result["optim." + p.key() + ".exp_avg"] = flat(s.exp_avg());
      result["optim." + p.key() + ".exp_avg_sq"] = flat(s.exp_avg_sq());
      result["optim." + p.key() + ".step"] = s.step();
    }
    result["step"] = step;
    std::ofstream(argv[3]) << result.dump();
  }
  std::cout << "dcp_resume_worker: rank " << rank << " trained to step " << step << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "dcp_resume_worker: " << e.what() << std::endl;
    return 1;
  }
}
