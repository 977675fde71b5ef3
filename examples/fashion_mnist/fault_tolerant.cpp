// The fault-tolerant loop (--fault-tolerance, docs/fault_tolerance.md). Each step:
// a quorum of the live replicas (a new DDP, or sharded optimizer, when it changed;
// fault_tolerant_optimizer.h), this replica's share of
// the step's global batch, forward and backward, and the optimizer step only when
// every member succeeded. Checkpoints (--checkpoint-dir) are written over the
// quorum's group and loaded when a quorum has no trained replica in it: the job's
// start, or the loss of every replica.
#include "fault_tolerant.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <memory>
#include <optional>

#include "cohort/checkpoint/atomic_file.h"
#include "cohort/checkpoint/checkpointer.h"
#include "cohort/checkpoint/state_dict.h"
#include "cohort/checkpoint/torch_format.h"
#include "cohort/data/fashion_mnist.h"
#include "cohort/fault_tolerance/replica_group.h"
#include "cohort/fault_tolerance/step_sampler.h"
#include "cohort/fault_tolerance/training_state.h"
#include "evaluate.h"
#include "fault_tolerant_optimizer.h"
#include "mixed_precision.h"
#include "model.h"
#include "settings.h"

namespace fashion_mnist {
namespace ft = cohort::fault_tolerance;

namespace {

using Clock = std::chrono::steady_clock;

double learning_rate(const TrainerOptions& o, double fraction_done) {
  if (o.schedule == "constant") return o.lr;
  return o.lr * 0.5 * (1.0 + std::cos(M_PI * std::clamp(fraction_done, 0.0, 1.0)));
}

// One step's forward and backward on this replica's share; false when a peer failed.
// Under --amp bf16 the forward and the loss run in autocast (Note [What fault
// tolerance composes with]: autocast keeps no state, so a lost replica loses none).
bool forward_backward(FaultTolerantOptimizer& optimizer, const MixedPrecision& precision,
                      cohort::data::FashionMnist& data, const std::vector<std::int64_t>& indices, double weight, double& loss_out) {
  try {
    auto batch = data.get_batch(std::vector<std::size_t>(indices.begin(), indices.end()));
    optimizer.zero_grad();
    at::Tensor loss;
    {
      const auto autocast = precision.autocast();
      loss = torch::nn::functional::cross_entropy(optimizer.forward(batch.data), batch.target);
    }
    (loss * weight).backward();
    loss_out = loss.item<double>();
    return true;
  } catch (const cohort::CommError& e) {
    std::cout << "step failed: " << std::string(e.what()).substr(0, 200) << std::endl;
  } catch (const cohort::TimeoutError& e) {
    std::cout << "step failed: " << std::string(e.what()).substr(0, 200) << std::endl;
  }
  return false;
}

}  // namespace

int train_fault_tolerant(const TrainerOptions& o) {
  const auto started = Clock::now();
  // Read before joining: the job's configuration holds the sizes of the data.
  cohort::data::FashionMnist train_set(o.data_dir, cohort::data::FashionMnist::Split::kTrain);
  cohort::data::FashionMnist test_set(o.data_dir, cohort::data::FashionMnist::Split::kTest);
  // Note [One configuration]: what every replica must have been started with alike,
  // the list every rank of a fixed world agrees on (Note [Settings every rank shares]
  // in settings.cpp, which says what is left out and why).
  const auto settings = shared_settings(o, static_cast<std::int64_t>(train_set.size().value()),
                                        static_cast<std::int64_t>(test_set.size().value()));
  auto replicas = ft::ReplicaGroup::join(ft::ReplicaGroupOptions::from_env(cohort::comm::process_environment())
                                             .configuration(as_configuration(settings))
                                             .shards_per_replica(o.shards_per_replica));
  const int id = replicas.replica_id();
  torch::manual_seed(o.seed);
  FashionNet model;
  if (o.memory_format == "channels-last") model->use_channels_last();
  if (o.activation_checkpointing) model->use_activation_checkpointing();
  FaultTolerantOptimizer optimizer(o, model);
  // bf16 only (options.cpp refuses fp16 here), so the scaler, and its group, are unused.
  const MixedPrecision precision(o, torch::kCPU, cohort::comm::Group());
  replicas.on_transfer([&](std::ostream& out) { optimizer.save_state(out); },
                       [&](std::istream& in) { optimizer.load_state(in); });

  // Note [A global batch per step]: --batch-size per replica of the full job.
  const auto global_batch = static_cast<std::int64_t>(o.batch_size) * replicas.max_replicas();
  ft::StepSampler sampler(
      ft::StepSamplerOptions(static_cast<std::int64_t>(train_set.size().value()), global_batch).seed(o.seed));
  auto per_epoch = sampler.steps_per_epoch();
  if (o.limit_train_batches > 0) per_epoch = std::min(per_epoch, o.limit_train_batches);
  const std::int64_t run_steps = per_epoch * o.epochs;  // the learning rate's schedule spans these
  std::int64_t total = run_steps;
  if (o.max_steps > 0) total = std::min(total, o.max_steps);
  // The sampler's epochs are whole passes; with --limit-train-batches each epoch is cut
  // short, so step s of the run is step s % per_epoch of epoch s / per_epoch.
  auto sampler_step = [&](std::int64_t s) { return (s / per_epoch) * sampler.steps_per_epoch() + s % per_epoch; };

  std::cout << fmt::format("replica {}: incarnation {} pid {}", id, replicas.incarnation(), getpid()) << std::endl;
  std::unique_ptr<cohort::checkpoint::Checkpointer> checkpointer;
  std::int64_t committed = 0;
  double loss = 0;
  const ft::Quorum* q = nullptr;
  while (replicas.step() < total) {
    try {
      q = &replicas.begin_step();
    } catch (const ft::TrainingFinished& e) {
      std::cout << e.what() << std::endl;
      return 0;
    }
    const auto step = replicas.step();
    bool ok = true;
    try {
      if (q->changed) {
        optimizer.on_quorum(*q);
        if (!o.checkpoint_dir.empty()) checkpointer = optimizer.checkpointer(o.checkpoint_dir, o.keep_checkpoints, *q);
        std::optional<std::int64_t> resumed;
        if (q->fresh_start && checkpointer) {
          if (auto restored = checkpointer->load_latest(*model, optimizer.optimizer(), torch::kCPU)) {
            replicas.resume_at(restored->progress.step);
            resumed = restored->progress.step;
            std::cout << fmt::format("replica {}: resuming from {} (step {})", id, restored->path,
                                     restored->progress.step)
                      << std::endl;
          }
        }
        // A fresh start after the first quorum: every replica that trained was lost,
        // and the job goes back to its checkpoint, or to step 0. Said loudly, once per
        // quorum, by its rank 0 (it went unsaid before: issue 46).
        if (q->fresh_start && q->id > 1 && q->rank == 0)
          std::cerr << fmt::format("replica {}: WARNING: no live replica holds the training state (every replica that "
                                   "trained was lost, or none had committed a step yet); training starts again {} "
                                   "(quorum {})",
                                   id,
                                   resumed ? fmt::format("from the checkpoint of step {}", *resumed)
                                           : std::string(checkpointer ? "from step 0: no checkpoint was found"
                                                                      : "from step 0: pass --checkpoint-dir to keep "
                                                                        "progress across such losses"),
                                   q->id)
                    << std::endl;
        std::cout << fmt::format("replica {}: training in quorum {} with replicas {} from step {}", id, q->id,
                                 fmt::join(q->replica_ids(), ", "), replicas.step())
                  << std::endl;
      }
    } catch (const cohort::CommError&) {
      ok = false;
    } catch (const cohort::TimeoutError&) {
      ok = false;
    }
    if (replicas.step() != step) continue;  // resumed from a checkpoint: begin that step
    const auto s = sampler_step(step);
    if (ok) optimizer.set_lr(learning_rate(o, static_cast<double>(step) / run_steps));
    ok = ok && forward_backward(optimizer, precision, train_set, sampler.indices(s, q->rank, q->size),
                                sampler.loss_weight(s, q->rank, q->size), loss);
    ok = optimizer.after_backward(*q, ok);  // whether or not it failed here
    if (!replicas.end_step(ok)) continue;
    ++committed;
    if (!optimizer.step(replicas)) {
      std::cout << fmt::format("replica {}: a rank of its replica was lost while stepping; this rank takes the state "
                               "of a live replica",
                               id)
                << std::endl;
      continue;
    }
    const auto done = replicas.step();
    const bool due = done == total || (o.checkpoint_every > 0 && done % o.checkpoint_every == 0);
    if (checkpointer && due && optimizer.writes_checkpoints(*q)) {
      try {
        cohort::checkpoint::TrainingProgress progress;
        progress.step = done;
        progress.epoch = done / per_epoch;
        progress.epoch_step = done % per_epoch;
        checkpointer->save(*model, optimizer.optimizer(), progress, torch::kCPU);
      } catch (const cohort::CommError& e) {
        // A member died while saving: the quorum re-forms at the next step, and the
        // next checkpoint is written by the survivors.
        std::cout << "checkpoint of step " << done << " failed: " << std::string(e.what()).substr(0, 200) << std::endl;
      } catch (const cohort::TimeoutError& e) {
        std::cout << "checkpoint of step " << done << " failed: " << std::string(e.what()).substr(0, 200) << std::endl;
      }
    }
    if (q->rank == 0 && (done % 50 == 0 || done == total))
      std::cout << fmt::format("step {}/{}: loss {:.4f} ({} replicas)", done, total, loss, q->size) << std::endl;
  }
  replicas.finish();
  const auto train_s = std::chrono::duration<double>(Clock::now() - started).count();
  // Note [Every member writes the final weights]: every member of the last quorum
  // holds the same weights, and each writes --save-final (atomically: the same
  // bytes, the last rename wins). When only the quorum's rank 0 wrote them, its death
  // after the last commit ended the job with exit 0 and no weights: its replacement
  // finds training finished and has nothing to write (found by review). Rank 0 then
  // scores the test set alone.
  if (!o.save_final.empty())
    cohort::checkpoint::write_file_atomically(
        o.save_final, cohort::checkpoint::torch_save_bytes(cohort::checkpoint::state_dict(*model)));
  if (q->rank != 0) return 0;
  torch::NoGradGuard no_grad;
  model->eval();
  std::int64_t correct = 0, seen = 0;
  double loss_sum = 0;
  const auto n = static_cast<std::int64_t>(test_set.size().value());
  for (std::int64_t begin = 0; begin < n; begin += 1000) {
    std::vector<std::size_t> idx;
    for (auto i = begin; i < std::min(n, begin + 1000); ++i) idx.push_back(static_cast<std::size_t>(i));
    auto batch = test_set.get_batch(idx);
    auto out = model->forward(batch.data);
    loss_sum += torch::nn::functional::cross_entropy(out, batch.target,
                                                     torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    correct += out.argmax(1).eq(batch.target).sum().item<std::int64_t>();
    seen += static_cast<std::int64_t>(idx.size());
  }
  const auto& stats = replicas.stats();
  nlohmann::json summary = {
      {"test_accuracy", static_cast<double>(correct) / seen},
      {"test_loss", loss_sum / seen},
      {"steps", replicas.step()},
      {"wall_seconds", train_s},
      {"world_size", q->size},
      {"amp", o.amp},
      {"fault_tolerance",
       {{"replica", id},
        {"incarnation", replicas.incarnation()},
        {"committed_here", committed},
        {"aborted_steps", stats.aborted_steps},
        {"quorums", stats.quorums},
        {"last_quorum", q->id},
        {"transfers_sent", stats.transfers_sent},
        {"transfers_received", stats.transfers_received}}},
  };
  std::cout << summary.dump() << std::endl;
  return 0;
}

}  // namespace fashion_mnist
