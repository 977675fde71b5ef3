#include "cohort/tensor_parallel/composition.h"

#include <fmt/format.h>

#include <string>

#include "cohort/errors.h"

namespace cohort::tensor_parallel {

namespace {

std::string describe(const Composition& c) {
  return fmt::format("dp {} x pp {} x tp {}{}{}", c.data(), c.pipeline(), c.tensor(),
                     c.zero() > 0 ? fmt::format(" with ZeRO-{}", c.zero()) : std::string(),
                     c.sequence_parallel() ? " and sequence parallelism" : "");
}

}  // namespace

void check_composition(const Composition& c) {
  if (c.data() < 1 || c.pipeline() < 1 || c.tensor() < 1)
    throw ConfigError(fmt::format("cohort: {}: every mesh size must be at least 1", describe(c)));
  if (c.zero() < 0 || c.zero() > 3)
    throw ConfigError(fmt::format("cohort: ZeRO stage {} does not exist; use 0 (DDP), 1, 2 or 3", c.zero()));
  // A pipeline runs one backward per micro-batch per stage. ZeRO-2 would reduce each
  // gradient to its owner in every one of them, and fully_shard wraps one whole model,
  // not a pipeline's stages.
  if (c.pipeline() > 1 && c.zero() >= 2)
    throw ConfigError(fmt::format("cohort: {} is not supported: ZeRO-{} cannot shard a pipeline's stages ({}); "
                                  "use ZeRO-1 or DDP over the data dimension with a pipeline, or pp 1 with ZeRO-{}",
                                  describe(c), c.zero(),
                                  c.zero() == 2 ? "it reduces gradients in every micro-batch's backward"
                                                : "fully_shard wraps one whole model",
                                  c.zero()));
  // Note [Sequence-parallel gradients under ZeRO-3]: the replicated parameters'
  // gradients (LayerNorms, biases) must be summed over the TP group after backward
  // (sum_replicated_gradients), but fully_shard has already reduce-scattered them
  // into its flat shards, where the parameters' own .grad is empty.
  if (c.zero() == 3 && c.sequence_parallel() && c.tensor() > 1)
    throw ConfigError(fmt::format("cohort: {} is not supported: under ZeRO-3 the replicated parameters' gradients "
                                  "live in fully_shard's flat shards, where sum_replicated_gradients cannot sum "
                                  "them over the TP group; turn sequence parallelism off, or use ZeRO-1/2 or DDP",
                                  describe(c)));
}

}  // namespace cohort::tensor_parallel
