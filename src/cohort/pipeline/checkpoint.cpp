#include "cohort/pipeline/checkpoint.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "cohort/errors.h"

namespace cohort::pipeline {

std::string stage_directory(const std::string& root, const Pipeline& pipeline) {
  return fmt::format("{}/stage-{}", root, pipeline.stages().front().index());
}

namespace {
// The minimum and the maximum of `value` over the group, in one all-reduce.
std::pair<std::int64_t, std::int64_t> min_max(comm::Group& group, std::int64_t value, c10::Device device) {
  auto t = at::tensor(std::vector<std::int64_t>{value, -value}, at::TensorOptions().dtype(at::kLong)).to(device);
  group.all_reduce(t, comm::ReduceOp::kMin);
  auto cpu = t.cpu();
  return {cpu[0].item<std::int64_t>(), -cpu[1].item<std::int64_t>()};
}
}  // namespace

std::optional<checkpoint::Restored> load_agreed(checkpoint::Checkpointer& checkpointer, torch::nn::Module& model,
                                                torch::optim::Optimizer& optimizer, comm::Group& everyone,
                                                c10::Device device) {
  std::optional<std::int64_t> at_most;
  // Each round either agrees or lowers the bound below a step some stage could not
  // load (it was corrupt and moved aside), so the rounds are bounded by the steps kept.
  for (int round = 0; round < 64; ++round) {
    std::int64_t newest = -1;
    for (auto step : checkpointer.steps_on_disk())
      if (!at_most || step <= *at_most) newest = std::max(newest, step);
    const auto candidate = min_max(everyone, newest, device).first;
    auto restored = checkpointer.load_latest(model, optimizer, device, candidate);
    const std::int64_t got = restored ? restored->progress.step : -1;
    const auto [low, high] = min_max(everyone, got, device);
    if (low == high) return restored;
    at_most = low;
  }
  throw Error(fmt::format("cohort pipeline: the stages' checkpoints in {} never agreed on a step to resume; move "
                          "the checkpoint directories aside to start afresh",
                          checkpointer.directory()));
}

}  // namespace cohort::pipeline
