#include "cuda_graphs.h"

#include "cohort/data/to_device.h"
#include "cohort/errors.h"
#include "cohort/optim/capturable.h"

namespace fashion_mnist {

namespace {

cohort::optim::Capturable& capturable_of(torch::optim::Optimizer& optimizer) {
  auto* c = dynamic_cast<cohort::optim::Capturable*>(&optimizer);
  if (!c || !c->capturable())
    throw cohort::ConfigError("--cuda-graphs: the optimizer is not capturable (Note [A step inside a CUDA graph]); "
                              "this is a defect of the trainer's wiring (optimizer.cpp)");
  return *c;
}

}  // namespace

GraphedStep::GraphedStep(Strategy& strategy, torch::optim::Optimizer& optimizer, MixedPrecision& precision,
                         c10::Device device, c10::Stream stream)
    : strategy_(strategy),
      optimizer_(optimizer),
      precision_(precision),
      device_(device),
      captured_(
          [this] {
            // Gradients set to none here are made again by backward, inside the
            // graph's pool on the captured step, so that every replay finds them at
            // the same addresses (Note [One graph for the whole step]).
            optimizer_.zero_grad();
            auto loss = strategy_.forward_backward(data_, target_, precision_, *profiler_);
            precision_.step(optimizer_);
            return loss;
          },
          cohort::cuda_graphs::CapturedStepOptions(device).stream(stream)) {
  auto* ddp = strategy.ddp();
  if (!ddp)
    throw cohort::ConfigError("--cuda-graphs captures plain DDP's step; this strategy has no DDP (use --zero 0, "
                              "--pipeline-stages 1 and --data-parallel-replicas 1)");
  captured_.use(*ddp).use(capturable_of(optimizer));
}

at::Tensor GraphedStep::step(const at::Tensor& data, const at::Tensor& target, cohort::trace::StepProfiler& profiler) {
  profiler_ = &profiler;
  auto staged_data = cohort::data::to_device(data, device_);
  auto staged_target = cohort::data::to_device(target, device_);
  if (!data_.defined()) {
    data_ = at::empty_like(staged_data);
    target_ = at::empty_like(staged_target);
  }
  if (staged_data.sizes() != data_.sizes() || staged_target.sizes() != target_.sizes())
    throw cohort::ConfigError("--cuda-graphs: a batch of shape " + c10::str(staged_data.sizes()) +
                              " after batches of " + c10::str(data_.sizes()) +
                              "; a captured step replays one shape (the trainer skips short batches)");
  data_.copy_(staged_data, /*non_blocking=*/true);
  target_.copy_(staged_target, /*non_blocking=*/true);
  // An eager step (and the capture) times its own phases, as without the flag.
  if (!captured_.captured()) return captured_.run();
  auto phase = profiler.phase("graph");
  return captured_.run();
}

}  // namespace fashion_mnist
