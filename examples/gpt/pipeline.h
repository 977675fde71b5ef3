#pragma once
// A Gpt split over the pipeline dimension of a device mesh, each stage itself split
// over the TP group: stage 0 holds the embeddings, the last stage the final
// LayerNorm, the tied output layer and the vocabulary-parallel loss, and the blocks
// are divided between the stages in order (the first stages take one more when they
// do not divide evenly).
//
//   comm::DeviceMesh mesh(world, comm::MeshShape().pipeline(2).tensor(2));
//   torch::manual_seed(seed);
//   Gpt model(mesh.group(comm::MeshDim::kTensor), GptOptions(vocab).layers(4));  // every rank, whole
//   GptPipeline pipe(model, world, mesh, GptPipelineOptions().microbatches(4));  // collective
//   pipe.data_parallel();                          // DDP over the mesh's data group, if dp > 1
//   torch::optim::AdamW opt(pipe.parameters(), 1e-3);
//   for (...) { opt.zero_grad(); auto r = pipe.step(ids, targets); opt.step(); }  // r.loss on every rank
//
// Every rank builds the whole (TP-sliced) model from the same seed first, so that
// each stage holds the one-process model's numbers (Note [Whole, then sliced]), and
// keeps only its stage's modules in the pipeline.
//
// Note [Tied embeddings across stages]
// The token embedding is used twice: by stage 0 to look up the ids, and by the last
// stage as the output layer. As Megatron-LM does, the last stage holds its own copy
// of the (vocabulary-parallel) table, initialised equal to stage 0's. Each copy's
// gradient after backward is only its own use's part; the whole model's gradient is
// their sum. step() all-reduces (sums) the two gradients over a group of the two
// ranks {stage 0, last stage} with the same data and tensor coordinates, so both
// copies get the same whole gradient and, stepped by the same optimizer, stay equal.
// The groups are built on every rank (World::new_group is collective), one per
// (data, tensor) pair. With data parallelism DDP has already averaged each copy's
// gradient over the data group by then; averaging and summing commute.
#include <torch/arg.h>

#include <optional>
#include <vector>

#include "cohort/amp/autocast.h"
#include "cohort/comm/device_mesh.h"
#include "cohort/comm/group.h"
#include "cohort/comm/world.h"
#include "cohort/pipeline/pipeline.h"
#include "model.h"

namespace gpt {

struct GptPipelineOptions {
  TORCH_ARG(cohort::pipeline::ScheduleKind, schedule) = cohort::pipeline::ScheduleKind::k1F1B;
  TORCH_ARG(int, microbatches) = 2;
  // Activation checkpointing per stage (PipelineOptions::recompute).
  TORCH_ARG(bool, recompute) = false;
  TORCH_ARG(c10::Device, device) = c10::Device(c10::kCPU);
  TORCH_ARG(std::optional<cohort::amp::AutocastOptions>, autocast) = std::nullopt;
};

// The blocks [first, last) of `layers` that stage `stage` of `stages` runs.
std::pair<std::int64_t, std::int64_t> stage_blocks(std::int64_t layers, int stage, int stages);

// One pipeline stage of a Gpt. Takes ids (first stage) or the residual stream, and
// returns the residual stream or (last stage) this rank's slice of the logits.
class GptStageImpl : public torch::nn::Module {
 public:
  GptStageImpl(const Gpt& model, int stage, int stages);
  at::Tensor forward(const at::Tensor& x);

  bool first, last;
  cohort::tensor_parallel::VocabParallelEmbedding embed{nullptr};  // first stage
  torch::nn::Embedding position{nullptr};                          // first stage
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm norm{nullptr};                               // last stage
  // The last stage's copy of the table (Note [Tied embeddings across stages]); null
  // when one stage holds both ends and uses `embed` itself.
  cohort::tensor_parallel::VocabParallelEmbedding output{nullptr};

 private:
  Gpt model_;  // for embed_tokens(); not registered (its parameters are all stages')
};
TORCH_MODULE(GptStage);

class GptPipeline {
 public:
  // Collective over the world: builds the pipeline over the mesh's pipeline group
  // and the tied-embedding groups. ConfigError for fewer blocks than stages, or a
  // model split over another TP size than the mesh's. `mesh` must outlive this.
  GptPipeline(const Gpt& model, const cohort::comm::World& world, cohort::comm::DeviceMesh& mesh,
              GptPipelineOptions options = GptPipelineOptions());

  // Collective over the mesh's data group: DDP for this rank's stage.
  void data_parallel();
  // One training step on the global batch's share of this data rank: ids and targets
  // [batch, S]. When it returns, every parameter's gradient is the whole model's:
  // the tied copies summed (Note [Tied embeddings across stages]) and, under
  // sequence parallelism, the replicated parameters summed over the TP group.
  cohort::pipeline::StepResult step(const at::Tensor& ids, const at::Tensor& targets);
  // Sums the two copies' gradients of the token embedding; step() calls it.
  void sum_tied_gradients();

  std::vector<at::Tensor> parameters() const { return pipeline_.parameters(); }
  const GptStage& stage() const { return stage_; }
  cohort::pipeline::Pipeline& pipeline() { return pipeline_; }

 private:
  GptStage stage_;
  cohort::comm::DeviceMesh& mesh_;
  bool sequence_parallel_;
  std::optional<cohort::comm::Group> tied_;  // first and last stage only, when they differ
  cohort::pipeline::Pipeline pipeline_;
};

}  // namespace gpt
