#pragma once
// Pipeline parallelism across processes. Each rank of a pipeline group holds one
// stage of the model (or, interleaved, several non-adjacent ones); a training step
// splits the batch into micro-batches and runs a schedule (schedule.h) in which the
// stages pass activations forward and gradients back by point-to-point messages.
//
//   auto world = cohort::comm::World::init();
//   auto parts = cohort::pipeline::split_by_parameters(model, world.size());
//   cohort::pipeline::Pipeline pipe({cohort::pipeline::PipelineStage(parts[world.rank()], world.rank())},
//       world.group(),
//       cohort::pipeline::PipelineOptions(loss_fn).schedule(ScheduleKind::k1F1B).microbatches(8));
//   torch::optim::SGD opt(pipe.parameters(), 0.1);
//   for (auto& [x, y] : batches) {          // every rank iterates; only stage 0 reads x,
//     opt.zero_grad();                       // only the last stage reads y
//     auto r = pipe.step({x}, {y});          // r.loss on every rank
//     opt.step();
//   }
//
// One step equals one step on the whole batch: each micro-batch's loss is weighted
// by its share of the batch's rows (Note [Micro-batch weights]). With
// data_parallel(), each stage is also replicated over a data-parallel group by
// cohort's DDP (mesh.h builds both groups).
#include <torch/arg.h>

#include <ATen/core/Dict.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/amp/autocast.h"
#include "cohort/comm/group.h"
#include "cohort/ddp/options.h"
#include "cohort/pipeline/schedule.h"
#include "cohort/pipeline/simulator.h"
#include "cohort/pipeline/stage.h"

namespace cohort::ddp {
class DistributedDataParallelBase;
}

namespace cohort::pipeline {

// The last stage's loss for one micro-batch, a scalar averaged over its rows (as
// torch::nn::functional losses are by default).
using LossFn = std::function<at::Tensor(const TensorList& outputs, const TensorList& targets)>;

struct PipelineOptions {
  explicit PipelineOptions(LossFn loss) : loss_(std::move(loss)) {}
  TORCH_ARG(LossFn, loss);
  TORCH_ARG(ScheduleKind, schedule) = ScheduleKind::k1F1B;
  TORCH_ARG(int, microbatches) = 1;
  // Stages per rank (interleaved only).
  TORCH_ARG(int, virtual_stages) = 1;
  // Activation checkpointing per stage: forward keeps only each micro-batch's
  // inputs, and backward recomputes the stage's forward (random generators restored,
  // so dropout draws the same mask) before differentiating it.
  TORCH_ARG(bool, recompute) = false;
  // Where this rank's stages live: received tensors are allocated here.
  TORCH_ARG(c10::Device, device) = c10::Device(c10::kCPU);
  // Mixed precision: each stage's forward and the loss run under this autocast (the
  // recomputation too; backward outside it, as in Python). None: as the caller's.
  TORCH_ARG(std::optional<amp::AutocastOptions>, autocast) = std::nullopt;
};

struct StepResult {
  std::vector<double> losses;  // each micro-batch's loss, on every rank
  double loss = 0;             // the whole batch's: the weighted mean of `losses`
  // Measured on this rank: the step's wall time and the time spent in forward and
  // backward; bubble = 1 - compute / step.
  double step_seconds = 0;
  double compute_seconds = 0;
  // The most micro-batches whose activations this rank held at once (forward done,
  // backward not yet).
  int peak_live_microbatches = 0;
};

class Pipeline {
 public:
  // Collective over `group`, the pipeline group: its rank r passes stages r,
  // r + size, r + 2 size, ... (one per virtual stage), in that order. Checks that
  // every rank has the same schedule settings (ConfigError on every rank otherwise)
  // and simulates the schedule (ConfigError if it would deadlock).
  Pipeline(std::vector<PipelineStage> stages, comm::Group group, PipelineOptions options);
  ~Pipeline();
  Pipeline(Pipeline&&) noexcept;
  Pipeline& operator=(Pipeline&&) noexcept;

  // Collective over `data_group`: wraps each of this rank's stages in DDP over it
  // (every member holds the same stages). Gradients accumulate locally over the
  // micro-batches; each stage's buckets are reduced during its last backward.
  void data_parallel(comm::Group data_group,
                     ddp::DistributedDataParallelOptions options = ddp::DistributedDataParallelOptions());

  // One training step. The first stage's rank passes the batch's inputs, cut along
  // dimension 0 into micro-batches; the last stage's rank passes the targets, cut the
  // same way. Other ranks may pass empty lists. Gradients accumulate into .grad.
  // `loss_scale` multiplies the loss before backward (a GradScaler's scale under
  // float16; amp/grad_scaler.h); the losses returned are unscaled.
  StepResult step(const TensorList& inputs, const TensorList& targets, double loss_scale = 1.0);
  // The same with micro-batches cut by the caller: they may differ in shape (e.g. in
  // sequence length). Each weighs its first target's rows over all micro-batches'
  // (its first input's, when the last stage passes no targets: a loss without them).
  StepResult step_microbatches(const std::vector<TensorList>& inputs, const std::vector<TensorList>& targets,
                               double loss_scale = 1.0);

  // Forward only, without gradients (evaluation): the last stage's rank returns the
  // outputs for the whole batch (concatenated along dimension 0), others nothing.
  // Under PipelineOptions::autocast unless `mixed_precision` is false: then as the
  // caller's autocast state says (outside one: float32, as models are usually
  // evaluated). Every rank passes the same.
  TensorList forward(const TensorList& inputs, int microbatches = 1, bool mixed_precision = true);

  // This rank's parameters, for its optimizer.
  std::vector<at::Tensor> parameters() const;
  // This rank's stages as one module whose parameters and buffers carry the whole
  // model's names: for checkpoints, train()/eval(), state_dict().
  std::shared_ptr<torch::nn::Module> local_module() const;
  // Collective over the pipeline group: the whole model's state dict (detached CPU
  // tensors), assembled on pipeline rank 0; empty on the other ranks.
  c10::Dict<std::string, at::Tensor> full_state_dict();

  const Schedule& schedule() const { return schedule_; }
  const SimulationResult& simulated() const { return simulated_; }
  comm::Group& group() { return group_; }
  const std::vector<PipelineStage>& stages() const { return stages_; }
  int rank() const { return rank_; }
  bool is_first() const;
  bool is_last() const;

 private:
  struct Slot;
  struct Run;
  void check_agreement();
  std::vector<std::int64_t> exchange_input_rows(Run& run, const std::vector<TensorList>& inputs);
  void run_action(Run& run, const Action& action);
  std::string where(const Action& action) const;
  void forward_action(Run& run, int stage, int mb);
  void backward_action(Run& run, ActionKind kind, int stage, int mb);
  int local_index(int stage) const;
  std::unique_ptr<amp::Autocast> autocast() const;  // null without options_.autocast()

  std::vector<PipelineStage> stages_;
  comm::Group group_;
  PipelineOptions options_;
  int rank_ = 0;
  Schedule schedule_;
  SimulationResult simulated_;
  std::shared_ptr<torch::nn::Module> local_module_;
  std::vector<std::unique_ptr<ddp::DistributedDataParallelBase>> ddp_;  // per stage; null: nothing to train
  bool data_parallel_ = false;
};

}  // namespace cohort::pipeline
