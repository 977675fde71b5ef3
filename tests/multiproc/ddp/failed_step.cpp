// A training loop that catches a failed backward and skips that batch (Note [A
// step that failed]), across real processes: every rank's backward throws in step
// 1, each rank later than the one before, and the run must still match the
// single-process reference that skipped the same batch.
#include <chrono>
#include <thread>

#include "ddp/checks.h"
#include "ddp/models.h"

namespace cohort::testing {

int run_failed_step(const WorkerArgs& a, comm::World& world) {
  const int r = world.rank(), n = world.size();
  constexpr int kFailingStep = 1;
  torch::manual_seed(42);
  auto reference = make_mlp();
  torch::manual_seed(42);
  ddp::DistributedDataParallel ddp(make_mlp(), world.group(), ddp_options(a));
  auto ref_opt = make_sgd(*reference);
  auto opt = make_sgd(*ddp.module());
  double grad_diff = 0;
  int caught = 0;
  for (int step = 0; step < a.steps; ++step) {
    auto b = global_batch(step, n * kRowsPerRank);
    opt.zero_grad();
    if (step == kFailingStep) {
      auto input = rows_of(b.x, r).clone().requires_grad_(true);
      // The input's gradient comes after every parameter's: all buckets are in flight.
      input.register_hook([](torch::Tensor) -> torch::Tensor { throw std::runtime_error("skip this batch"); });
      auto loss = torch::mse_loss(ddp(input), rows_of(b.y, r));
      std::this_thread::sleep_for(std::chrono::milliseconds(300 * r));  // skew, not synchronisation
      try {
        loss.backward();
      } catch (const std::exception&) {
        ++caught;
      }
      continue;  // the batch is skipped, by the reference too
    }
    ref_opt.zero_grad();
    torch::mse_loss(reference->forward(b.x), b.y).backward();
    torch::mse_loss(ddp(rows_of(b.x, r)), rows_of(b.y, r)).backward();
    grad_diff = std::max(grad_diff, max_grad_diff(*reference, *ddp.module()));
    ref_opt.step();
    opt.step();
  }
  if (caught != 1) {
    std::cout << "failed_step FAILED rank " << r << ": the failing backward did not throw" << std::endl;
    return 1;
  }
  return report("failed_step", world, max_param_diff(*reference, *ddp.module()), grad_diff);
}

}  // namespace cohort::testing
