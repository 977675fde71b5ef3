#pragma once
// trainer.pt of a checkpoint: where training stands (step, epoch, sampler) and every
// rank's random generators, pickled as a dict so that Python can inspect it too:
//   torch.load("trainer.pt")  ->  {"step": 120, "epoch": 1, "sampler": {...}, "rng": [[...], ...]}
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "cohort/checkpoint/checkpointer.h"

namespace cohort::checkpoint {

struct TrainerState {
  TrainingProgress progress;
  std::vector<std::vector<at::Tensor>> rng;  // per rank, as capture_rng_state returns
};

std::string encode_trainer_state(const TrainingProgress& progress,
                                 const std::vector<std::vector<at::Tensor>>& rng);
// Throws cohort::DataError naming `source` when the bytes are not such a dict.
TrainerState decode_trainer_state(const std::string& bytes, const std::string& source);

}  // namespace cohort::checkpoint
