// The trainer's default strategy: the whole model on every rank under cohort's DDP.
#include <torch/nn/functional/loss.h>

#include "cohort/checkpoint/state_dict.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "model.h"
#include "strategy.h"

namespace fashion_mnist {
namespace {

class DataParallel : public Strategy {
 public:
  DataParallel(const TrainerOptions& o, cohort::comm::World& world, c10::Device device)
      : world_(world), device_(device), model_(init(o, device)),
        ddp_(model_, world.group(), cohort::ddp::DistributedDataParallelOptions().record_timings(true)) {}

  torch::nn::Module& model() override { return *model_; }
  int replicas() const override { return world_.size(); }
  int replica() const override { return world_.rank(); }

  double forward_backward(const torch::Tensor& data, const torch::Tensor& target, MixedPrecision& precision,
                          cohort::trace::StepProfiler& profiler) override {
    torch::Tensor loss;
    {
      auto p = profiler.phase("forward");
      auto autocast = precision.autocast();
      loss = torch::nn::functional::cross_entropy(ddp_(data.to(device_)), target.to(device_));
    }
    auto p = profiler.phase("backward");
    precision.scale(loss).backward();
    return loss.item<double>();
  }

  double last_wait_seconds() const override {
    const auto& t = ddp_.last_timings();
    return t.finalize_end_s > t.backward_end_s ? t.finalize_end_s - t.backward_end_s : 0;
  }

  Evaluation evaluate(cohort::data::FashionMnist& test) override {
    return fashion_mnist::evaluate(model_, test, world_.group(), device_);
  }

  std::unique_ptr<cohort::checkpoint::Checkpointer> checkpointer(const TrainerOptions& o) override {
    return std::make_unique<cohort::checkpoint::Checkpointer>(
        o.checkpoint_dir, world_.group(), cohort::checkpoint::CheckpointerOptions().keep_last(o.keep_checkpoints));
  }

  std::optional<cohort::checkpoint::Restored> resume(cohort::checkpoint::Checkpointer& checkpointer,
                                                     torch::optim::Optimizer& optimizer) override {
    return checkpointer.load_latest(*model_, optimizer, device_);
  }

  c10::Dict<std::string, at::Tensor> final_state() override {
    return world_.rank() == 0 ? cohort::checkpoint::state_dict(*model_) : c10::Dict<std::string, at::Tensor>();
  }

 private:
  static FashionNet init(const TrainerOptions& o, c10::Device device) {
    torch::manual_seed(o.seed);
    FashionNet model;
    model->to(device);
    if (o.memory_format == "channels-last") model->use_channels_last();
    if (o.activation_checkpointing) model->use_activation_checkpointing();
    return model;
  }

  cohort::comm::World& world_;
  c10::Device device_;
  FashionNet model_;
  cohort::ddp::DistributedDataParallel<FashionNet> ddp_;  // checks the replicas, broadcasts rank 0's weights
};

}  // namespace

std::unique_ptr<Strategy> make_data_parallel(const TrainerOptions& o, cohort::comm::World& world, c10::Device device) {
  return std::make_unique<DataParallel>(o, world, device);
}

}  // namespace fashion_mnist
