#include "trainer.h"

#include <ATen/Context.h>
#include <c10/core/StreamGuard.h>
#include <fmt/format.h>
#include <sys/resource.h>
// GCC 12 at -O1 warns that LibTorch 2.11's data loader may move an uninitialized
// Tensor (torch::data::detail::sequencers::OrderedSequencer::next, which this file's
// loader instantiates): a false positive in LibTorch's headers, which their system
// include path does not silence once the code is instantiated here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <torch/torch.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <chrono>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/pipeline/checkpoint.h"
#include "cohort/checkpoint/atomic_file.h"
#include "cohort/checkpoint/state_dict.h"
#include "cohort/checkpoint/torch_format.h"
#include "cohort/comm/world.h"
#include "cohort/data/distributed_sampler.h"
#include "cohort/data/fashion_mnist.h"
#include "cohort/errors.h"
#include "cohort/system/cuda.h"
#include "checkpointing.h"
#include "cuda_graphs.h"
#include "evaluate.h"
#include "fault_tolerant.h"
#include "optimizer.h"
#include "cohort/trace/device_mean.h"
#include "cohort/trace/step_profiler.h"
#include "cohort/trace/world_timeline.h"
#include "performance.h"
#include "progress.h"
#include "settings.h"
#include "strategy.h"

namespace fashion_mnist {
namespace {

using Clock = std::chrono::steady_clock;
using cohort::data::FashionMnist;

c10::Device choose_device(const TrainerOptions& o, const cohort::comm::World& world) {
  if (o.device == "cpu" || (o.device == "auto" && !torch::cuda::is_available())) return torch::kCPU;
  if (!torch::cuda::is_available())
    throw cohort::ConfigError("--device cuda: no CUDA device is usable: " + cohort::system::detect_cuda().why_no_gpu() +
                              "; or use --device cpu (or auto)");
  if (world.device().is_cuda()) return world.device();
  const auto count = static_cast<int>(torch::cuda::device_count());
  return c10::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank() % count));
}

// Cosine decay from the peak to zero over the run. It follows the fraction of the
// run's samples already trained, not the step count, so that a run resumed at
// another world size (other steps, same samples) continues the same curve, and a
// resumed run computes bitwise the same rates as one never interrupted.
double learning_rate(const TrainerOptions& o, double fraction_done) {
  if (o.schedule == "constant") return o.lr;
  return o.lr * 0.5 * (1.0 + std::cos(M_PI * std::clamp(fraction_done, 0.0, 1.0)));
}

double peak_rss_mb() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

void make_deterministic() {
  // cuBLAS is deterministic only with a fixed workspace, which must be chosen before
  // its first handle exists.
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  // Note [Deterministic training]: every kernel must pick the same algorithm and the
  // same reduction order in every run. The buckets' all-reduce sums each element over
  // the ranks; cohort's buckets keep the same composition from run to run once built,
  // and a resumed run rebuilds them the same way.
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  at::globalContext().setBenchmarkCuDNN(false);
}

}  // namespace

int train(const TrainerOptions& o) {
  if (o.fault_tolerance) return train_fault_tolerant(o);  // no fixed World: fault_tolerant.cpp
  const auto started = Clock::now();
  // Note [--device cpu on a GPU machine]: the backend "auto" picks NCCL when every
  // local rank has a GPU, and NCCL moves only CUDA tensors; a model kept on the CPU
  // needs Gloo (found on the first GPU run: DDP refused the CPU model over NCCL).
  auto init = cohort::trace::traced();
  if (o.device == "cpu" && init.backend() == "auto") init.backend("gloo");
  auto world = cohort::comm::World::init(init);
  const bool lead = world.rank() == 0;
  if (o.deterministic) make_deterministic();
  const c10::Device device = choose_device(o, world);
  if (o.cuda_graphs) {  // --device auto may have landed on the CPU, or this LibTorch has no CUDA
    const auto why = cohort::cuda_graphs::why_no_cuda_graphs(device);
    if (!why.empty()) throw cohort::ConfigError("fashion_mnist: --cuda-graphs: " + why);
  }

  FashionMnist train_set(o.data_dir, FashionMnist::Split::kTrain);
  FashionMnist test_set(o.data_dir, FashionMnist::Split::kTest);
  // Note [Settings every rank shares] (settings.cpp): a rank started with other flags
  // is named here, by every rank, before any collective that the flags shape.
  cohort::comm::agree_on_settings(world, shared_settings(o, static_cast<std::int64_t>(train_set.size().value()),
                                                         static_cast<std::int64_t>(test_set.size().value())));

  // Every rank builds the same initial weights from the seed; DDP checks that and
  // broadcasts rank 0's anyway.
  // --cuda-graphs: DDP is built on the stream its step is captured on (Note
  // [Gradient accumulators on the capture stream] in cuda_graphs/captured_step.h),
  // and that stream is waited for before anything else reads what it wrote.
  std::optional<c10::Stream> graph_stream;
  if (o.cuda_graphs) graph_stream = cohort::cuda_graphs::capture_stream(device);
  auto make_strategy = [&] {
    return o.pipeline_stages > 1         ? make_pipeline(o, world, device)
           : o.data_parallel_replicas > 1 ? make_replicas(o, world, device)
           : o.zero == 2                  ? make_sharded_gradients(o, world, device)
           : o.zero == 3                  ? make_fully_sharded(o, world, device)
                                          : make_data_parallel(o, world, device);
  };
  std::unique_ptr<Strategy> strategy;
  if (graph_stream) {
    c10::StreamGuard on_graph_stream(*graph_stream);
    strategy = make_strategy();
  } else {
    strategy = make_strategy();
  }
  if (graph_stream) graph_stream->synchronize();
  auto optimizer = make_optimizer(o, *strategy, world);
  MixedPrecision precision(o, device, world.group());
  std::unique_ptr<GraphedStep> graphed;  // --cuda-graphs
  if (graph_stream) graphed = std::make_unique<GraphedStep>(*strategy, *optimizer, precision, device, *graph_stream);
  // A captured step replays one batch shape (Note [Short last batch]).
  const std::int64_t min_rows = graphed ? o.batch_size : strategy->min_batch_rows();
  // The data is sharded over the data-parallel replicas: every stage of one pipeline
  // reads the same batch (the first stage its images, the last its labels).
  cohort::data::DistributedSampler sampler(
      train_set.size().value(),
      cohort::data::DistributedSamplerOptions(strategy->replica(), strategy->replicas()).seed(o.seed));

  std::unique_ptr<cohort::checkpoint::Checkpointer> checkpointer;
  CheckpointLog checkpoint_log;
  cohort::checkpoint::TrainingProgress progress;
  if (!o.checkpoint_dir.empty()) {
    // Stage checkpoints hold parts of the model: a run without a pipeline refuses them
    // (a pipeline run refuses whole-model ones in its resume).
    if (o.pipeline_stages <= 1) cohort::pipeline::refuse_pipeline_checkpoints(o.checkpoint_dir);
    checkpointer = strategy->checkpointer(o);
    if (auto restored = strategy->resume(*checkpointer, *optimizer)) {
      progress = restored->progress;
      precision.restore(progress);
      strategy->restore_state(progress);
      if (progress.sampler) sampler.load_state(*progress.sampler);
      if (lead) {
        std::cout << "resuming from " << restored->path << " (epoch " << progress.epoch + 1 << ", step "
                  << progress.step << ")" << std::endl;
      }
    }
  }

  // Note [Resume on another world size]: the sampler's state counts samples of the
  // epoch over all ranks, so a run resumed by more or fewer processes continues at the
  // next sample of the epoch with the rest re-sharded, and the learning rate follows
  // samples too. Steps per epoch differ (the batch is per rank); the saved
  // epoch_step is for people, never used to resume.
  cohort::trace::StepProfiler profiler(cohort::trace::timeline_of(world));
  std::size_t reported_steps = 0;  // step times already in a periodic straggler report
  auto loader = torch::data::make_data_loader(
      train_set, sampler, torch::data::DataLoaderOptions().batch_size(static_cast<std::size_t>(o.batch_size)));

  // Samples per epoch over all ranks: the padded dataset, or the --limit-train-batches
  // share of it.
  const std::int64_t world_size = strategy->replicas();
  const auto n = static_cast<std::int64_t>(train_set.size().value());
  const std::int64_t global_batch = o.batch_size * world_size;
  std::int64_t epoch_samples = (n + world_size - 1) / world_size * world_size;
  if (o.limit_train_batches > 0) epoch_samples = std::min(epoch_samples, o.limit_train_batches * global_batch);
  const double run_samples = static_cast<double>(epoch_samples) * o.epochs;

  Progress bar(std::cout, Progress::stdout_is_interactive(), o.log_interval_s);
  // Training time excludes evaluation and checkpoints, so samples/s is the training rate.
  double train_s = 0;
  auto mark = Clock::now();
  auto pause = [&] { train_s += std::chrono::duration<double>(Clock::now() - mark).count(); };
  auto resume = [&] { mark = Clock::now(); };
  std::int64_t samples_this_run = 0;  // by all ranks, since this process started
  // Note [No host read per step]: the loss stays on the device and is read only when
  // the progress line is due, so the host queues the next step while the GPU runs
  // this one; the line shows the mean loss since the last one.
  cohort::trace::DeviceMean losses;
  double shown_loss = 0;
  Evaluation last_eval;
  bool evaluated = false;
  bool stopped = false;  // by --max-steps
  bool warned_short = false;

  auto save = [&](std::int64_t epoch, std::int64_t epoch_step) {
    progress.epoch = epoch;
    progress.epoch_step = epoch_step;
    progress.sampler = sampler.state();
    precision.save(progress);
    strategy->save_state(progress);
    pause();
    checkpoint_log.timed([&] { strategy->save(*checkpointer, *optimizer, progress, device); });
    resume();
  };

  for (std::int64_t epoch = progress.epoch; epoch < o.epochs && !stopped; ++epoch) {
    sampler.set_epoch(epoch);
    // After a resume the epoch starts part-way: `done` samples of it are trained, on
    // whatever world size the checkpoint was written by (Note [Resume on another
    // world size]).
    std::int64_t done = sampler.state().consumed;
    std::int64_t epoch_step = done / global_batch;
    std::int64_t steps_in_epoch = epoch_step + static_cast<std::int64_t>((sampler.size() + o.batch_size - 1) / o.batch_size);
    if (o.limit_train_batches > 0) steps_in_epoch = std::min(steps_in_epoch, o.limit_train_batches);
    // Stop at the limit without asking the loader for one more batch, which would
    // move the sampler past what was trained.
    auto it = loader->end();
    if (epoch_step < steps_in_epoch) {
      auto p = profiler.phase("data");
      it = loader->begin();
    }
    for (; it != loader->end();) {
      auto& batch = *it;
      if (batch.data.size(0) < min_rows) {
        // Note [Short last batch]: only an epoch's last batch can be short (the
        // sampler pads the replicas to equal shares), and a pipeline cannot cut it
        // into its micro-batches, nor a CUDA graph replay another shape. Every
        // replica skips it alike, as a data loader with drop_last would; its samples
        // count as seen, so a resume lands where it would.
        if (lead && !warned_short) {
          std::cout << fmt::format("note: skipping each epoch's last batch of {} rows per replica: {} (use a "
                                   "--batch-size that divides the data{})",
                                   batch.data.size(0),
                                   graphed ? "a CUDA graph replays batches of --batch-size rows"
                                           : fmt::format("the pipeline cuts a batch into {} micro-batches", min_rows),
                                   graphed ? "" : ", or fewer --microbatches")
                    << std::endl;
        }
        warned_short = true;
        done += static_cast<std::int64_t>(batch.data.size(0)) * world_size;
        break;
      }
      profiler.begin_step(progress.step + 1);
      const double fraction = (static_cast<double>(epoch * epoch_samples) + done) / run_samples;
      optimizer->param_groups()[0].options().set_lr(learning_rate(o, fraction));
      at::Tensor loss;
      if (graphed) {
        loss = graphed->step(batch.data, batch.target, profiler);
      } else {
        optimizer->zero_grad();
        loss = strategy->forward_backward(batch.data, batch.target, precision, profiler);
        auto p = profiler.phase("optimizer");
        precision.step(*optimizer);
      }
      ++progress.step;
      ++epoch_step;
      const std::int64_t trained = static_cast<std::int64_t>(batch.data.size(0)) * world_size;
      done += trained;
      samples_this_run += trained;

      if (lead) {
        losses.add(loss);
        const bool end = epoch_step == steps_in_epoch;
        if (bar.due(end)) shown_loss = losses.take().value_or(shown_loss);
        const double elapsed = train_s + std::chrono::duration<double>(Clock::now() - mark).count();
        const double rate = samples_this_run / std::max(elapsed, 1e-9);
        const double left = run_samples - static_cast<double>(epoch * epoch_samples + done);
        bar.show({static_cast<int>(epoch + 1), o.epochs, epoch_step, steps_in_epoch, shown_loss, rate,
                  left / std::max(rate, 1e-9)},
                 end);
      }
      stopped = o.max_steps > 0 && progress.step >= o.max_steps;
      // The epoch's last step is saved below, as the start of the next epoch.
      const bool last = epoch_step >= steps_in_epoch;
      if (checkpointer && !last &&
          (stopped || (o.checkpoint_every > 0 && progress.step % o.checkpoint_every == 0))) {
        auto p = profiler.phase("checkpoint");
        save(epoch, epoch_step);
      }
      if (checkpointer) checkpoint_log.report_failure(*checkpointer, lead);
      if (!last && !stopped) {
        auto p = profiler.phase("data");
        ++it;
      }
      // The time DDP waited for the other ranks' gradients is theirs, not this rank's
      // (Note [Straggler step times]).
      profiler.end_step(strategy->last_wait_seconds());
      if (o.straggler_every > 0 && progress.step % o.straggler_every == 0) {
        pause();
        report_stragglers(profiler, reported_steps, world, device, o,
                          fmt::format("straggler report, steps {}-{}:", progress.step - o.straggler_every + 1,
                                      progress.step),
                          false);
        reported_steps = profiler.work_times().size();
        resume();
      }
      if (last || stopped) break;
    }
    if (stopped && epoch_step < steps_in_epoch) break;
    // The epoch is done: the next checkpoint starts the next one.
    progress.epoch = epoch + 1;
    progress.epoch_step = 0;
    pause();
    {
      cohort::trace::Span span(profiler.timeline(), "evaluate");
      last_eval = strategy->evaluate(test_set);
    }
    evaluated = true;
    if (lead) {
      bar.finish_line();
      std::cout << fmt::format("epoch {}/{}: test accuracy {:.4f}, test loss {:.4f}, {:.1f} s since start", epoch + 1,
                               o.epochs, last_eval.accuracy(), last_eval.loss(),
                               std::chrono::duration<double>(Clock::now() - started).count())
                << std::endl;
    }
    resume();
    if (checkpointer) {
      sampler.set_epoch(epoch + 1);
      save(epoch + 1, 0);
    }
  }
  pause();
  if (checkpointer) checkpointer->wait(device);  // the last asynchronous write, or its failure on every rank
  if (lead) bar.finish_line();
  if (!evaluated) last_eval = strategy->evaluate(test_set);
  report_stragglers(profiler, 0, world, device, o,
                    fmt::format("straggler report, all {} steps of this run:", profiler.steps()), true);

  // Rank 0 writes the final weights; every rank learns whether that worked, and the
  // largest worker's peak memory, in one all-reduce.
  std::string final_error;
  c10::Dict<std::string, at::Tensor> final_state;
  if (!o.save_final.empty()) final_state = strategy->final_state();  // collective
  if (!o.save_final.empty() && lead) {
    try {
      cohort::checkpoint::write_file_atomically(o.save_final, cohort::checkpoint::torch_save_bytes(final_state));
    } catch (const std::exception& e) {
      final_error = e.what();
    }
  }
  auto tail = torch::tensor({peak_rss_mb(), final_error.empty() ? 0.0 : 1.0},
                            torch::dtype(torch::kFloat64).device(device));
  world.group().all_reduce(tail, cohort::comm::ReduceOp::kMax);
  const auto rss = tail.cpu();
  if (rss[1].item<double>() != 0) {
    throw cohort::Error(lead ? fmt::format("--save-final {}: {}", o.save_final, final_error)
                             : fmt::format("rank 0 could not write --save-final {}; its log says why", o.save_final));
  }

  auto strategy_summary = strategy->summary();  // collective
  auto memory = memory_per_rank(strategy->model(), *optimizer, world, device);  // collective
  if (lead) {
    nlohmann::json summary = {
        {"test_accuracy", last_eval.accuracy()},
        {"test_loss", last_eval.loss()},
        {"samples_per_second", samples_this_run / std::max(train_s, 1e-9)},
        {"train_seconds", train_s},
        {"wall_seconds", std::chrono::duration<double>(Clock::now() - started).count()},
        {"world_size", world.size()},
        {"epochs", o.epochs},
        {"steps", progress.step},
        {"peak_rss_mb_max_rank", rss[0].item<double>()},
        {"samples", samples_this_run},
        {"device", device.str()},
        {"amp", o.amp},
        {"zero", o.zero},
        {"cuda_graphs", graphed != nullptr && graphed->captured()},
        {"memory_per_rank", memory},
    };
    if (checkpointer) summary["checkpoints"] = checkpoint_log.summary(*checkpointer, o.checkpoint_async);
    if (o.amp == "fp16") summary["amp_scaler"] = {{"scale", precision.loss_scale()}, {"skipped_steps", precision.skipped_steps()}};
    summary.update(strategy_summary);
    summary.update(performance_summary(profiler, samples_this_run / std::max(train_s, 1e-9), world, device));
    std::cout << summary.dump() << std::endl;
  }
  return 0;
}

}  // namespace fashion_mnist
