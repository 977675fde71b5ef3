// The trainer's default strategy: the whole model on every rank under cohort's DDP.
#include "cohort/ddp/distributed_data_parallel.h"
#include "comm_hook.h"
#include "whole_model.h"

namespace fashion_mnist {
namespace {

class DataParallel : public WholeModel {
 public:
  DataParallel(const TrainerOptions& o, cohort::comm::World& world, c10::Device device)
      : WholeModel(o, world, device),
        hook_(o),
        ddp_(model_, world.group(),
             // A captured step cannot time its buckets (Note [DDP inside a CUDA graph]).
             cohort::ddp::DistributedDataParallelOptions().record_timings(!o.cuda_graphs).comm_hook(hook_.hook())) {}

  cohort::ddp::DistributedDataParallelBase* ddp() override { return &ddp_; }

  void save_state(cohort::checkpoint::TrainingProgress& progress) override { hook_.save(progress, world_.group()); }
  void restore_state(const cohort::checkpoint::TrainingProgress& progress) override {
    hook_.restore(progress, world_.group());
  }
  nlohmann::json summary() override { return hook_.summary(); }

  at::Tensor forward_backward(const torch::Tensor& data, const torch::Tensor& target, MixedPrecision& precision,
                              cohort::trace::StepProfiler& profiler) override {
    return step_through([this](const torch::Tensor& x) { return ddp_(x); }, data, target, precision, profiler);
  }

  double last_wait_seconds() const override {
    const auto& t = ddp_.last_timings();
    return t.finalize_end_s > t.backward_end_s ? t.finalize_end_s - t.backward_end_s : 0;
  }

 private:
  CommHookChoice hook_;
  cohort::ddp::DistributedDataParallel<FashionNet> ddp_;  // checks the replicas, broadcasts rank 0's weights
};

}  // namespace

std::unique_ptr<Strategy> make_data_parallel(const TrainerOptions& o, cohort::comm::World& world, c10::Device device) {
  return std::make_unique<DataParallel>(o, world, device);
}

}  // namespace fashion_mnist
