// A CNN whose BatchNorm becomes SyncBatchNorm under DDP. The reference runs plain
// BatchNorm on the whole batch, so batch statistics, running statistics, gradients
// and weights must all agree.
#include "cohort/ddp/sync_batch_norm.h"
#include "ddp/checks.h"

namespace cohort::testing {

namespace {
torch::nn::Sequential make_cnn() {
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)), torch::nn::BatchNorm2d(4),
                               torch::nn::ReLU(), torch::nn::MaxPool2d(2), torch::nn::Flatten(),
                               torch::nn::Linear(4 * 13 * 13, 10));
}
}  // namespace

int run_cnn_parity(const WorkerArgs& a, comm::World& world) {
  const int r = world.rank(), n = world.size();
  torch::manual_seed(42);
  auto reference = make_cnn();
  auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
  if (ddp::convert_sync_batchnorm(model, world.group()) != 1) {
    std::cout << "parity cnn_syncbn FAILED rank " << r << ": expected one converted layer" << std::endl;
    return 1;
  }
  ddp::DistributedDataParallel ddp(torch::nn::Sequential(model), world.group(), ddp_options(a));
  auto ref_opt = make_sgd(*reference);
  auto opt = make_sgd(*ddp.module());
  double grad_diff = 0;
  for (int step = 0; step < a.steps; ++step) {
    torch::manual_seed(2000 + step);
    auto x = torch::randn({n * kRowsPerRank, 1, 28, 28});
    auto y = torch::randint(0, 10, {n * kRowsPerRank}, torch::kLong);
    ref_opt.zero_grad();
    torch::cross_entropy_loss(reference->forward(x), y).backward();
    opt.zero_grad();
    torch::cross_entropy_loss(ddp(rows_of(x, r)), rows_of(y, r)).backward();
    grad_diff = std::max(grad_diff, max_grad_diff(*reference, *ddp.module()));
    ref_opt.step();
    opt.step();
  }
  // Evaluation uses the running statistics, which must match too.
  reference->eval();
  ddp.module()->eval();
  torch::NoGradGuard no_grad;
  torch::manual_seed(3000);
  auto probe = torch::randn({4, 1, 28, 28});
  double eval_diff = (reference->forward(probe) - ddp(probe)).abs().max().item<double>();
  return report("parity cnn_syncbn", world, std::max(max_param_diff(*reference, *ddp.module()), eval_diff),
                grad_diff, 1e-4);
}

}  // namespace cohort::testing
