#include "checkpoints.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "cohort/errors.h"
#include "cohort/tensor_parallel/checkpoint.h"

namespace gpt {
namespace {

const GptTrainerOptions& checked(const GptTrainerOptions& o) {
  if (o.zero > 0)
    throw cohort::ConfigError(fmt::format(
        "gpt: --checkpoint-dir with --zero {}: the checkpoints of a tensor-parallel model gather its split "
        "parameters whole, which cohort's checkpointer does not do yet for a ZeRO optimizer's sharded state; "
        "use --zero 0 (DDP over the replicas) with --checkpoint-dir, or leave out --checkpoint-dir",
        o.zero));
  if (o.pp > 1)
    throw cohort::ConfigError(fmt::format(
        "gpt: --checkpoint-dir with --pp {}: checkpoints of a pipeline's tensor-parallel stages are untested, "
        "so the trainer does not take them; use --pp 1 with --checkpoint-dir, or leave out --checkpoint-dir",
        o.pp));
  return o;
}

}  // namespace

Checkpoints::Checkpoints(const GptTrainerOptions& o, const cohort::comm::World& world)
    : options_(checked(o)),
      checkpointer_(o.checkpoint_dir, world.group(),
                    cohort::checkpoint::CheckpointerOptions()
                        .split_parameters(cohort::tensor_parallel::parameter_splits)
                        .asynchronous(o.checkpoint_async)
                        .format(o.checkpoint_format == "dcp" ? cohort::checkpoint::Format::kDcp
                                                             : cohort::checkpoint::Format::kCohort)
                        .when_busy(o.checkpoint_when_busy == "skip" ? cohort::checkpoint::WhenBusy::kSkip
                                                                    : cohort::checkpoint::WhenBusy::kWait)) {}

// Note [Checkpoint the GPT, not its DDP]: the state is the Gpt module's, not the
// strategy's model(), so that its names are the same with and without DDP (one
// replica has none): a checkpoint of --tp 2 --dp 1 loads at --tp 1 --dp 2. The
// optimizer steps the same parameters in the same order.
std::optional<std::int64_t> Checkpoints::resume(Strategy& strategy, torch::optim::Optimizer& optimizer,
                                                c10::Device device) {
  auto restored = checkpointer_.load_latest(strategy.gpt(), optimizer, device);
  if (!restored) return std::nullopt;
  return restored->progress.step;
}

bool Checkpoints::due(std::int64_t step) const {
  return (options_.checkpoint_every > 0 && step % options_.checkpoint_every == 0) || step == options_.steps ||
         step == options_.stop_after;
}

void Checkpoints::save(Strategy& strategy, const torch::optim::Optimizer& optimizer, std::int64_t step,
                       c10::Device device) {
  cohort::checkpoint::TrainingProgress progress;
  progress.step = step;
  const auto begin = std::chrono::steady_clock::now();
  checkpointer_.save(strategy.gpt(), optimizer, progress, device);
  blocked_s_.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
}

nlohmann::json Checkpoints::summary() const {
  auto sorted = blocked_s_;
  std::sort(sorted.begin(), sorted.end());
  double total = 0;
  for (double s : sorted) total += s;
  const auto stats = checkpointer_.async_stats();
  return {{"async", options_.checkpoint_async},
          {"format", options_.checkpoint_format},
          {"saves", sorted.size()},
          {"skipped", stats.skipped},
          {"writer_cpu_s", stats.writer_cpu_s},
          {"blocked_s", total},
          {"blocked_ms_median", sorted.empty() ? 0.0 : 1e3 * sorted[sorted.size() / 2]},
          {"blocked_ms_max", sorted.empty() ? 0.0 : 1e3 * sorted.back()}};
}

}  // namespace gpt
