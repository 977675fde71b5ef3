// The default strategy: the TP-split model on every data-parallel replica, under
// cohort's DDP over the mesh's data group. DDP averages each parameter's gradient
// over the replicas that hold the same TP slice (the data group of a TP rank), so
// the TP collectives and DDP's never meet. With one replica there is nothing to
// reduce, and no DDP.
#include <optional>

#include "cohort/ddp/distributed_data_parallel.h"
#include "strategy.h"

namespace gpt {
namespace {

class DataParallel : public Strategy {
 public:
  DataParallel(Gpt model, cohort::comm::DeviceMesh& mesh) : model_(std::move(model)) {
    auto& data = mesh.group(cohort::comm::MeshDim::kData);
    if (data.size() > 1) ddp_.emplace(model_, data);  // checks the replicas, broadcasts replica 0's weights
  }

  torch::nn::Module& model() override { return *model_; }
  GptImpl& gpt() override { return *model_; }
  at::Tensor forward(const at::Tensor& ids) override { return ddp_ ? (*ddp_)(ids) : model_(ids); }
  at::Tensor infer(const at::Tensor& ids) override { return model_(ids); }
  std::string name() const override { return ddp_ ? "ddp" : "none"; }

 private:
  Gpt model_;
  std::optional<cohort::ddp::DistributedDataParallel<Gpt>> ddp_;
};

}  // namespace

std::unique_ptr<Strategy> make_data_parallel(Gpt model, cohort::comm::DeviceMesh& mesh) {
  return std::make_unique<DataParallel>(std::move(model), mesh);
}

}  // namespace gpt
