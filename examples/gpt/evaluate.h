#pragma once
// The validation loss: each data-parallel replica scores its share of every
// validation batch (Note [The batch rule]), and the sums are added over the data
// group, so every rank gets the loss of all eval_batches x B windows. With a pipeline
// only the last stage scores (Pipeline::forward), and the sums are added over the
// pipeline group too.
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

#include "cohort/comm/device_mesh.h"
#include "options.h"
#include "strategy.h"

namespace gpt {

struct Evaluation {
  double loss = 0;  // mean cross-entropy per token, nats
  double perplexity() const;
};

// Collective over the world (every rank runs the same forwards).
Evaluation evaluate(Strategy& strategy, const std::vector<std::int32_t>& validation, const GptTrainerOptions& o,
                    cohort::comm::DeviceMesh& mesh, c10::Device device);

}  // namespace gpt
