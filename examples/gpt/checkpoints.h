#pragma once
// --checkpoint-dir: the GPT trainer's checkpoints (docs/gpt.md#checkpoints). The TP
// layers' parameters are saved whole with AdamW's state (CheckpointerOptions::
// split_parameters), so a run resumes at any --tp and --dp. The data position is a
// pure function of the step (Note [The batch rule] in batches.h), so the step is all
// the trainer keeps besides the model, the optimizer and the generators, which the
// checkpointer restores itself.
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/comm/world.h"
#include "options.h"
#include "strategy.h"

namespace gpt {

class Checkpoints {
 public:
  // Refuses, with a cohort::ConfigError naming the flags, what cannot be
  // checkpointed yet: --zero > 0 and --pp > 1.
  Checkpoints(const GptTrainerOptions& o, const cohort::comm::World& world);

  // Collective. The step of the newest checkpoint, loaded into the model, the
  // optimizer and the generators; nullopt when the directory holds none.
  std::optional<std::int64_t> resume(Strategy& strategy, torch::optim::Optimizer& optimizer, c10::Device device);

  // Whether step (1-based, just taken) is saved: every --checkpoint-every steps, the
  // last step and the --stop-after step.
  bool due(std::int64_t step) const;

  // Collective. Saves the state after `step` steps.
  void save(Strategy& strategy, const torch::optim::Optimizer& optimizer, std::int64_t step, c10::Device device);
  // With --checkpoint-async: rank 0's log line for a write that failed (the next
  // save or finish() raises it), or nothing.
  std::optional<std::string> write_failure() const { return checkpointer_.write_failure(); }
  // Collective: returns once no checkpoint is being written; throws if the last
  // asynchronous write failed. Before the trainer reports success.
  void finish(c10::Device device) { checkpointer_.wait(device); }
  // For the final JSON line: how many saves, and how long they held this rank's
  // loop (total, median, largest), as the Fashion-MNIST trainer reports them.
  nlohmann::json summary() const;

 private:
  GptTrainerOptions options_;
  cohort::checkpoint::Checkpointer checkpointer_;
  std::vector<double> blocked_s_;  // per save
};

}  // namespace gpt
