// --data-parallel-replicas N: one process, N replicas of the model (N CPU replicas,
// or one per visible GPU with --device cuda) under cohort::dp::DataParallel.
#include <fmt/format.h>
#include <torch/cuda.h>

#include "cohort/dp/data_parallel.h"
#include "cohort/errors.h"
#include "whole_model.h"

namespace fashion_mnist {
namespace {

std::vector<c10::Device> replica_devices(int n, c10::Device device, cohort::comm::World& world) {
  if (world.size() > 1)
    throw cohort::ConfigError(fmt::format(
        "--data-parallel-replicas runs one process, but this job has {} ranks; start it with --nproc-per-node 1, or "
        "drop the flag and let DDP run one process per device (the faster choice: docs/data_parallel.md)",
        world.size()));
  if (device.is_cuda() && n > static_cast<int>(torch::cuda::device_count()))
    throw cohort::ConfigError(fmt::format("--data-parallel-replicas {} with --device cuda, but {} GPUs are visible", n,
                                          torch::cuda::device_count()));
  std::vector<c10::Device> out;
  for (int i = 0; i < n; ++i) out.push_back(device.is_cuda() ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)) : device);
  return out;
}

class Replicas : public WholeModel {
 public:
  Replicas(const TrainerOptions& o, cohort::comm::World& world, c10::Device device)
      : WholeModel(o, world, device), dp_(model_, replica_devices(o.data_parallel_replicas, device, world)) {}

  at::Tensor forward_backward(const torch::Tensor& data, const torch::Tensor& target, MixedPrecision& precision,
                              cohort::trace::StepProfiler& profiler) override {
    return step_through([this](const torch::Tensor& x) { return dp_(x); }, data, target, precision, profiler);
  }

 private:
  cohort::dp::DataParallel<FashionNet> dp_;
};

}  // namespace

std::unique_ptr<Strategy> make_replicas(const TrainerOptions& o, cohort::comm::World& world, c10::Device device) {
  return std::make_unique<Replicas>(o, world, device);
}

}  // namespace fashion_mnist
