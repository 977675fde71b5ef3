#pragma once
// How the trainer spreads the model over the mesh's data-parallel dimension; the
// tensor-parallel split is the model's own (model.h). trainer.cpp's loop is the same
// for every strategy; each strategy's wiring lives in its own file:
//   data_parallel.cpp      the TP-split model on every replica, under cohort's DDP over
//                          the mesh's data group (none when there is one replica);
//                          --zero 1 shards its optimizer (optimizer.cpp)
//   sharded_gradients.cpp  --zero 2: no DDP; the ZeRO-2 optimizer reduces the gradients
//   fully_sharded.cpp      --zero 3: every block a cohort::zero::FullyShard unit over
//                          the data group
//   pipeline_parallel.cpp  --pp > 1: this rank's stage of a GptPipeline (pipeline.h),
//                          1F1B over --microbatches, DDP (and --zero 1) over the data group
//   mixed_precision.cpp    --amp, used by each of them
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>

#include "cohort/comm/device_mesh.h"
#include "cohort/zero/fully_shard.h"
#include "cohort/comm/world.h"
#include "model.h"
#include "options.h"
#include "pipeline.h"

namespace gpt {

class Strategy {
 public:
  virtual ~Strategy() = default;
  // This rank's part of the model: what its optimizer steps (but under --zero 3).
  virtual torch::nn::Module& model() = 0;
  // The GPT itself: its loss, its options.
  virtual GptImpl& gpt() = 0;
  // The training forward (through DDP where there is one): this rank's logits slice.
  virtual at::Tensor forward(const at::Tensor& ids) = 0;
  // The forward of evaluation and sampling, under no_grad; collective over the data
  // group under --zero 3.
  virtual at::Tensor infer(const at::Tensor& ids) { return forward(ids); }
  // The sharded model under --zero 3 (its optimizer is built over the shards).
  virtual const cohort::zero::FullyShardedModel* fully_sharded() const { return nullptr; }
  // The pipeline under --pp > 1, else null. A pipeline has no whole-model forward on
  // one rank: the trainer steps it with GptPipeline::step, evaluation and sampling
  // run Pipeline::forward (only the last stage gets logits), and forward() and
  // infer() throw.
  virtual GptPipeline* pipeline() { return nullptr; }
  // How gradients cross the data group, for the final JSON line.
  virtual std::string name() const = 0;
};

// Each takes the model built (and seeded alike) on every rank, on its device.
std::unique_ptr<Strategy> make_data_parallel(Gpt model, cohort::comm::DeviceMesh& mesh);
std::unique_ptr<Strategy> make_sharded_gradients(Gpt model, cohort::comm::DeviceMesh& mesh);
std::unique_ptr<Strategy> make_fully_sharded(Gpt model, cohort::comm::DeviceMesh& mesh);
// Collective over the world (the pipeline's and the tied embeddings' groups).
std::unique_ptr<Strategy> make_pipeline_parallel(Gpt model, const cohort::comm::World& world,
                                                 cohort::comm::DeviceMesh& mesh, const GptTrainerOptions& o,
                                                 c10::Device device);

}  // namespace gpt
