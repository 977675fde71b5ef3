// --pp > 1: this rank keeps one stage of the GPT (examples/gpt/pipeline.h: the
// blocks split between the stages in order, the tied embedding copied to the last
// stage) and trains it under the 1F1B schedule over --microbatches micro-batches of
// its data rank's rows. With more than one replica each stage is under DDP over the
// mesh's data group (GptPipeline::data_parallel); --zero 1 then shards the AdamW
// state over that group (optimizer.cpp), as tests/multiproc/tensor_parallel/
// gpt_parity_worker.cpp proves equal to one process. ZeRO-2/3 are refused before
// this is built (tensor_parallel::check_composition, in trainer.cpp).
#include <stdexcept>

#include "cohort/amp/autocast.h"
#include "strategy.h"

namespace gpt {
namespace {

GptPipelineOptions pipeline_options(const GptTrainerOptions& o, c10::Device device) {
  auto options = GptPipelineOptions()
                     .schedule(cohort::pipeline::ScheduleKind::k1F1B)
                     .microbatches(o.microbatches > 0 ? o.microbatches : o.pp)
                     .recompute(o.activation_checkpointing)  // per stage, in place of the model's own
                     .device(device);
  // Each stage's forward and the loss run under the pipeline's autocast.
  if (o.amp != "none")
    options.autocast(cohort::amp::AutocastOptions(device.type()).dtype(cohort::amp::parse_amp_dtype(o.amp)));
  return options;
}

class PipelineParallel : public Strategy {
 public:
  PipelineParallel(Gpt model, const cohort::comm::World& world, cohort::comm::DeviceMesh& mesh,
                   const GptTrainerOptions& o, c10::Device device)
      : model_(std::move(model)), pipe_(model_, world, mesh, pipeline_options(o, device)), stage_(pipe_.stage()) {
    ddp_ = mesh.size(cohort::comm::MeshDim::kData) > 1;
    pipe_.data_parallel();  // nothing with one replica
  }

  torch::nn::Module& model() override { return *stage_; }
  GptImpl& gpt() override { return *model_; }
  at::Tensor forward(const at::Tensor&) override {
    throw std::logic_error("gpt: a pipeline has no forward on one rank; step it with GptPipeline::step");
  }
  at::Tensor infer(const at::Tensor&) override {
    throw std::logic_error("gpt: a pipeline has no forward on one rank; use Pipeline::forward");
  }
  GptPipeline* pipeline() override { return &pipe_; }
  std::string name() const override { return ddp_ ? "pipeline+ddp" : "pipeline"; }

 private:
  Gpt model_;  // the whole (TP-sliced) model: its loss, options and FLOP count
  GptPipeline pipe_;
  GptStage stage_;  // this rank's stage (shares pipe_'s)
  bool ddp_ = false;
};

}  // namespace

std::unique_ptr<Strategy> make_pipeline_parallel(Gpt model, const cohort::comm::World& world,
                                                 cohort::comm::DeviceMesh& mesh, const GptTrainerOptions& o,
                                                 c10::Device device) {
  return std::make_unique<PipelineParallel>(std::move(model), world, mesh, o, device);
}

}  // namespace gpt
