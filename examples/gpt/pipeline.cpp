#include "pipeline.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <mutex>
#include <utility>

#include "cohort/errors.h"
#include "cohort/tensor_parallel/cross_entropy.h"

namespace gpt {

namespace tp = cohort::tensor_parallel;
using cohort::comm::MeshDim;

std::pair<std::int64_t, std::int64_t> stage_blocks(std::int64_t layers, int stage, int stages) {
  const std::int64_t base = layers / stages, extra = layers % stages;
  const std::int64_t first = stage * base + std::min<std::int64_t>(stage, extra);
  return {first, first + base + (stage < extra ? 1 : 0)};
}

namespace {

// The last stage's copy of the token embedding, equal to the model's. Building a
// VocabParallelEmbedding draws a table from the CPU generator; putting the
// generator back keeps every later draw (dropout) the one-process model's.
tp::VocabParallelEmbedding copy_of(const tp::VocabParallelEmbedding& embed) {
  auto generator = at::detail::getDefaultCPUGenerator();
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  tp::VocabParallelEmbedding copy(embed->group(), embed->options);
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }
  torch::NoGradGuard no_grad;
  copy->weight.copy_(embed->weight);
  return copy;
}

}  // namespace

GptStageImpl::GptStageImpl(const Gpt& model, int stage, int stages)
    : first(stage == 0), last(stage == stages - 1), model_(model) {
  if (first) {
    embed = register_module("embed", model->embed);
    position = register_module("position", model->position);
  }
  blocks = register_module("blocks", torch::nn::ModuleList());
  const auto [b0, b1] = stage_blocks(model->options.layers(), stage, stages);
  for (auto b = b0; b < b1; ++b) blocks->push_back((*model->blocks)[b]);
  if (last) {
    norm = register_module("norm", model->norm);
    // One stage holding both ends uses the table itself (tied as in one process).
    if (!first) output = register_module("output", copy_of(model->embed));
  }
}

// Note [The stage's mode is the model's]
// The first stage runs the model's embed_tokens(), whose dropout follows the Gpt's
// own training flag; but the Gpt is not a child of the stage (its parameters are all
// stages'), so the stage's train() and eval() never reach it, and evaluation and
// sampling ran with the embedding's dropout on, drawing from the generator and so
// changing every later step. The stage hands its own mode to the Gpt before each
// use; train() on the Gpt reaches only modules that the stage's own train() has
// already set (or that no stage of this rank runs).
at::Tensor GptStageImpl::forward(const at::Tensor& input) {
  if (first && model_->is_training() != is_training()) model_->train(is_training());
  auto x = first ? model_->embed_tokens(input) : input;
  for (const auto& block : *blocks) x = block->as<tp::ParallelTransformerBlock>()->forward(x);
  if (!last) return x;
  return (output ? output : embed)->logits(norm(x));
}

namespace {

cohort::pipeline::PipelineOptions pipeline_options(const GptPipelineOptions& o, cohort::comm::Group tp_group) {
  auto loss = [tp_group](const cohort::pipeline::TensorList& out, const cohort::pipeline::TensorList& targets) {
    return tp::vocab_parallel_cross_entropy(out.at(0), targets.at(0), tp_group);
  };
  return cohort::pipeline::PipelineOptions(loss)
      .schedule(o.schedule())
      .microbatches(o.microbatches())
      .recompute(o.recompute())
      .device(o.device())
      .autocast(o.autocast());
}

GptStage checked_stage(const Gpt& model, cohort::comm::DeviceMesh& mesh) {
  const int stages = mesh.size(MeshDim::kPipeline);
  if (model->options.layers() < stages)
    throw cohort::ConfigError(fmt::format("gpt pipeline: {} blocks cannot fill {} pipeline stages (each needs at "
                                          "least one); use --pp {} or fewer, or more --layers",
                                          model->options.layers(), stages, model->options.layers()));
  if (model->tp_group().size() != mesh.size(MeshDim::kTensor))
    throw cohort::ConfigError(fmt::format("gpt pipeline: the model is split over a TP group of {} ranks but the mesh "
                                          "({}) has tensor size {}; build the model over the mesh's tensor group",
                                          model->tp_group().size(), mesh.describe(), mesh.size(MeshDim::kTensor)));
  return GptStage(model, mesh.coordinate(MeshDim::kPipeline), stages);
}

}  // namespace

GptPipeline::GptPipeline(const Gpt& model, const cohort::comm::World& world, cohort::comm::DeviceMesh& mesh,
                         GptPipelineOptions options)
    : stage_(checked_stage(model, mesh)),
      mesh_(mesh),
      sequence_parallel_(model->options.sequence_parallel()),
      pipeline_({cohort::pipeline::PipelineStage(stage_.ptr(), mesh.coordinate(MeshDim::kPipeline),
                                                 [stage = stage_](const cohort::pipeline::TensorList& in) mutable {
                                                   return cohort::pipeline::TensorList{stage->forward(in.at(0))};
                                                 })},
                mesh.group(MeshDim::kPipeline), pipeline_options(options, model->tp_group())) {
  // Note [Tied embeddings across stages]: every rank builds every pair's group.
  const int stages = mesh.size(MeshDim::kPipeline);
  if (stages == 1) return;
  for (int d = 0; d < mesh.size(MeshDim::kData); ++d)
    for (int t = 0; t < mesh.size(MeshDim::kTensor); ++t) {
      auto group = world.new_group({mesh.global_rank(d, 0, t), mesh.global_rank(d, stages - 1, t)});
      if (group.is_member()) tied_ = group;
    }
}

void GptPipeline::data_parallel() {
  if (mesh_.size(MeshDim::kData) > 1) pipeline_.data_parallel(mesh_.group(MeshDim::kData));
}

void GptPipeline::sum_tied_gradients() {
  if (!tied_) return;
  auto& table = stage_->first ? stage_->embed : stage_->output;
  if (!table->weight.grad().defined()) table->weight.mutable_grad() = torch::zeros_like(table->weight);
  auto grad = table->weight.grad();
  tied_->all_reduce(grad);
}

cohort::pipeline::StepResult GptPipeline::step(const at::Tensor& ids, const at::Tensor& targets) {
  auto result = pipeline_.step({ids}, {targets});
  sum_tied_gradients();
  if (sequence_parallel_) tp::sum_replicated_gradients(*stage_, mesh_.group(MeshDim::kTensor));
  return result;
}

}  // namespace gpt
