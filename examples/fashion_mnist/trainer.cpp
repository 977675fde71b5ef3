#include "trainer.h"

#include <ATen/Context.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/checkpoint/state_dict.h"
#include "cohort/comm/world.h"
#include "cohort/data/distributed_sampler.h"
#include "cohort/data/fashion_mnist.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "evaluate.h"
#include "model.h"
#include "progress.h"

namespace fashion_mnist {
namespace {

using Clock = std::chrono::steady_clock;
using cohort::data::FashionMnist;

c10::Device choose_device(const TrainerOptions& o, const cohort::comm::World& world) {
  if (o.device == "cpu" || (o.device == "auto" && !torch::cuda::is_available())) return torch::kCPU;
  if (!torch::cuda::is_available()) {
    throw cohort::ConfigError(
        "--device cuda: no CUDA device is usable (this LibTorch has no CUDA, or no GPU is "
        "visible); use --device cpu, or a CUDA build of LibTorch on a machine with a GPU");
  }
  if (world.device().is_cuda()) return world.device();
  const auto count = static_cast<int>(torch::cuda::device_count());
  return c10::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank() % count));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainerOptions& o, FashionNet& model) {
  if (o.optimizer == "sgd") {
    return std::make_unique<torch::optim::SGD>(model->parameters(),
                                               torch::optim::SGDOptions(o.lr).momentum(0.9));
  }
  return std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(o.lr));
}

// Cosine decay from the peak to zero over the whole run, by global step, so that a
// resumed run uses the same rate at the same step.
double learning_rate(const TrainerOptions& o, std::int64_t step, std::int64_t total_steps) {
  if (o.schedule == "constant" || total_steps <= 0) return o.lr;
  const double progress = std::min(1.0, static_cast<double>(step) / static_cast<double>(total_steps));
  return o.lr * 0.5 * (1.0 + std::cos(M_PI * progress));
}

double peak_rss_mb() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

void make_deterministic() {
  // Note [Deterministic training]: every kernel must pick the same algorithm and the
  // same reduction order in every run. The buckets' all-reduce sums each element over
  // the ranks; cohort's buckets keep the same composition from run to run once built,
  // and a resumed run rebuilds them the same way.
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  at::globalContext().setBenchmarkCuDNN(false);
}

}  // namespace

int train(const TrainerOptions& o) {
  const auto started = Clock::now();
  auto world = cohort::comm::World::init();
  const bool lead = world.rank() == 0;
  if (o.deterministic) make_deterministic();
  const c10::Device device = choose_device(o, world);

  FashionMnist train_set(o.data_dir, FashionMnist::Split::kTrain);
  FashionMnist test_set(o.data_dir, FashionMnist::Split::kTest);

  torch::manual_seed(o.seed);
  FashionNet model;
  model->to(device);
  auto optimizer = make_optimizer(o, model);
  cohort::data::DistributedSampler sampler(
      train_set.size().value(),
      cohort::data::DistributedSamplerOptions(world.rank(), world.size()).seed(o.seed));

  std::optional<cohort::checkpoint::Checkpointer> checkpointer;
  cohort::checkpoint::TrainingProgress progress;
  if (!o.checkpoint_dir.empty()) {
    checkpointer.emplace(o.checkpoint_dir, world.group(),
                         cohort::checkpoint::CheckpointerOptions().keep_last(o.keep_checkpoints));
    if (auto restored = checkpointer->load_latest(*model, *optimizer, device)) {
      progress = restored->progress;
      if (progress.sampler) sampler.load_state(*progress.sampler);
      if (lead) {
        std::cout << "resuming from " << restored->path << " (epoch " << progress.epoch + 1 << ", step "
                  << progress.step << ")" << std::endl;
      }
    }
  }

  // Every rank now holds the same weights; the wrapper checks that and broadcasts
  // rank 0's anyway.
  cohort::ddp::DistributedDataParallel ddp(model, world.group());
  auto loader = torch::data::make_data_loader(
      train_set, sampler, torch::data::DataLoaderOptions().batch_size(static_cast<std::size_t>(o.batch_size)));

  const auto world_size = static_cast<std::size_t>(world.size());
  const auto shard = (train_set.size().value() + world_size - 1) / world_size;
  auto steps_per_epoch = static_cast<std::int64_t>((shard + o.batch_size - 1) / o.batch_size);
  if (o.limit_train_batches > 0) steps_per_epoch = std::min(steps_per_epoch, o.limit_train_batches);
  const std::int64_t total_steps = steps_per_epoch * o.epochs;

  Progress bar(std::cout, Progress::stdout_is_interactive(), o.log_interval_s);
  // Training time excludes evaluation and checkpoints, so samples/s is the training rate.
  double train_s = 0;
  auto mark = Clock::now();
  auto pause = [&] { train_s += std::chrono::duration<double>(Clock::now() - mark).count(); };
  auto resume = [&] { mark = Clock::now(); };
  std::int64_t samples_this_run = 0;  // by all ranks, since this process started
  double running_loss = 0;
  Evaluation last_eval;
  bool evaluated = false;

  auto save = [&](std::int64_t epoch, std::int64_t epoch_step) {
    progress.epoch = epoch;
    progress.epoch_step = epoch_step;
    progress.sampler = sampler.state();
    pause();
    checkpointer->save(*model, *optimizer, progress, device);
    resume();
  };

  for (std::int64_t epoch = progress.epoch; epoch < o.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    std::int64_t epoch_step = epoch == progress.epoch ? progress.epoch_step : 0;
    for (auto& batch : *loader) {
      if (epoch_step >= steps_per_epoch) break;
      optimizer->param_groups()[0].options().set_lr(learning_rate(o, progress.step, total_steps));
      optimizer->zero_grad();
      auto loss = torch::nn::functional::cross_entropy(ddp(batch.data.to(device)), batch.target.to(device));
      loss.backward();
      optimizer->step();
      ++progress.step;
      ++epoch_step;
      samples_this_run += static_cast<std::int64_t>(batch.data.size(0)) * world.size();

      if (lead) {
        const double value = loss.item<double>();
        running_loss = epoch_step == 1 ? value : 0.95 * running_loss + 0.05 * value;
        const double elapsed = train_s + std::chrono::duration<double>(Clock::now() - mark).count();
        const double rate = samples_this_run / std::max(elapsed, 1e-9);
        const double steps_left = static_cast<double>(total_steps - progress.step);
        bar.show({static_cast<int>(epoch + 1), o.epochs, epoch_step, steps_per_epoch, running_loss, rate,
                  steps_left * o.batch_size * world.size() / std::max(rate, 1e-9)},
                 epoch_step == steps_per_epoch);
      }
      if (checkpointer && o.checkpoint_every > 0 && progress.step % o.checkpoint_every == 0) {
        save(epoch, epoch_step);
      }
    }
    // The epoch is done: the next checkpoint starts the next one.
    progress.epoch = epoch + 1;
    progress.epoch_step = 0;
    pause();
    last_eval = evaluate(model, test_set, world.group(), device);
    evaluated = true;
    if (lead) {
      bar.finish_line();
      std::cout << fmt::format("epoch {}/{}: test accuracy {:.4f}, test loss {:.4f}", epoch + 1, o.epochs,
                               last_eval.accuracy(), last_eval.loss())
                << std::endl;
    }
    resume();
    if (checkpointer) {
      sampler.set_epoch(epoch + 1);
      save(epoch + 1, 0);
    }
  }
  pause();
  if (!evaluated) last_eval = evaluate(model, test_set, world.group(), device);

  if (!o.save_final.empty() && lead) cohort::checkpoint::save_state_dict(*model, o.save_final);
  // The largest worker's peak memory, so that one line tells the whole job's story.
  auto rss = torch::tensor({peak_rss_mb()}, torch::dtype(torch::kFloat64).device(device));
  world.group().all_reduce(rss, cohort::comm::ReduceOp::kMax);
  world.group().barrier();

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
        {"peak_rss_mb_max_rank", rss.cpu().item<double>()},
        {"device", device.str()},
    };
    std::cout << summary.dump() << std::endl;
  }
  return 0;
}

}  // namespace fashion_mnist
