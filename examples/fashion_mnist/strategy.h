#pragma once
// How the trainer spreads the model over the ranks. trainer.cpp's loop is the same
// for every strategy; each strategy's wiring lives in its own file:
//   data_parallel.cpp   the whole model on every rank, under cohort's DDP
//   sharded_gradients.cpp  the whole model on every rank, gradients reduced by the
//                       ZeRO-2 optimizer instead of DDP (--zero 2)
//   fully_sharded.cpp   every parameter sharded over the ranks, gathered layer by
//                       layer (ZeRO-3, cohort::zero::fully_shard; --zero 3)
//   pipeline_parallel.cpp  the model cut into stages (cohort::pipeline), DDP per stage
//   replicas.cpp        one process, N replicas (cohort::dp::DataParallel)
//   mixed_precision.cpp --amp, used by each of them
//   fault_tolerant.cpp  --fault-tolerance: its own loop over the live replicas
//                       (cohort::fault_tolerance), DDP re-formed when they change;
//   fault_tolerant_optimizer.cpp  its optimizer: whole, or sharded inside each
//                       replica (--zero 1|2 --shards-per-replica K)
#include <ATen/core/Dict.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/comm/world.h"
#include "cohort/data/fashion_mnist.h"
#include "cohort/trace/step_profiler.h"
#include "cohort/zero/fully_shard.h"
#include "evaluate.h"
#include "mixed_precision.h"
#include "options.h"

namespace cohort::ddp {
class DistributedDataParallelBase;
}  // namespace cohort::ddp

namespace fashion_mnist {

class Strategy {
 public:
  virtual ~Strategy() = default;
  // This rank's part of the model: its optimizer's parameters, what it checkpoints.
  virtual torch::nn::Module& model() = 0;
  // Data-parallel replicas and this rank's: the sampler shards the data over them.
  virtual int replicas() const = 0;
  virtual int replica() const = 0;
  // The fewest rows a batch may have (a pipeline cuts it into this many micro-batches);
  // the loop skips an epoch's last batch when it is shorter (Note [Short last batch]).
  virtual std::int64_t min_batch_rows() const { return 1; }
  // Forward and backward of one step on this replica's batch (gradients in .grad);
  // returns the batch's mean loss, on the device and detached: the loop reads it
  // only when it prints (Note [No host read per step]).
  // `precision` wraps the forward and the loss in autocast and scales the loss.
  virtual at::Tensor forward_backward(const torch::Tensor& data, const torch::Tensor& target, MixedPrecision& precision,
                                  cohort::trace::StepProfiler& profiler) = 0;
  // Seconds of the last step spent waiting for other ranks' gradients (not this
  // rank's own work, Note [Straggler step times]).
  virtual double last_wait_seconds() const { return 0; }
  // Collective: the test set's accuracy and loss, on every rank.
  virtual Evaluation evaluate(cohort::data::FashionMnist& test) = 0;
  // Checkpoints: where and over which group.
  virtual std::unique_ptr<cohort::checkpoint::Checkpointer> checkpointer(const TrainerOptions& o) = 0;
  virtual std::optional<cohort::checkpoint::Restored> resume(cohort::checkpoint::Checkpointer& checkpointer,
                                                             torch::optim::Optimizer& optimizer) = 0;
  // Collective: writes a checkpoint of model() and `optimizer`.
  virtual void save(cohort::checkpoint::Checkpointer& checkpointer, torch::optim::Optimizer& optimizer,
                    const cohort::checkpoint::TrainingProgress& progress, c10::Device device) {
    checkpointer.save(model(), optimizer, progress, device);
  }
  // The DDP the step runs through (--cuda-graphs captures it); null where there is none.
  virtual cohort::ddp::DistributedDataParallelBase* ddp() { return nullptr; }
  // The sharded model under --zero 3 (its optimizer is built over the shards); null otherwise.
  virtual const cohort::zero::FullyShardedModel* fully_sharded() const { return nullptr; }
  // Collective: the strategy's own state into a checkpoint (PowerSGD's), and back.
  virtual void save_state(cohort::checkpoint::TrainingProgress&) {}
  virtual void restore_state(const cohort::checkpoint::TrainingProgress&) {}
  // Collective: the whole model's state dict, on world rank 0 (empty elsewhere).
  virtual c10::Dict<std::string, at::Tensor> final_state() = 0;
  // Collective: the strategy's share of the final JSON line (rank 0 prints it).
  virtual nlohmann::json summary() { return nlohmann::json::object(); }
};

std::unique_ptr<Strategy> make_data_parallel(const TrainerOptions& o, cohort::comm::World& world, c10::Device device);
std::unique_ptr<Strategy> make_sharded_gradients(const TrainerOptions& o, cohort::comm::World& world,
                                                c10::Device device);
std::unique_ptr<Strategy> make_fully_sharded(const TrainerOptions& o, cohort::comm::World& world,
                                             c10::Device device);
std::unique_ptr<Strategy> make_replicas(const TrainerOptions& o, cohort::comm::World& world, c10::Device device);
std::unique_ptr<Strategy> make_pipeline(const TrainerOptions& o, cohort::comm::World& world, c10::Device device);

}  // namespace fashion_mnist
