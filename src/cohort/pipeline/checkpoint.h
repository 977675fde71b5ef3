#pragma once
// Checkpoints of a pipeline: each stage saves its own parameters and optimizer state
// through the ordinary checkpointer (checkpoint/checkpointer.h), in a directory of
// its own, over its data-parallel group (whose rank 0 writes). Resuming must pick the
// same step in every stage, even when a stage died between its save and another's:
//
//   Checkpointer ckpt(stage_directory(root, pipe), mesh.data_group());
//   auto restored = load_agreed(ckpt, *pipe.local_module(), opt, world.group(), device);
//   ...
//   ckpt.save(*pipe.local_module(), opt, progress, device);   // every stage, same steps
#include <optional>
#include <string>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/pipeline/pipeline.h"

namespace cohort::pipeline {

// root/stage-<s>, s being the first stage this rank holds.
std::string stage_directory(const std::string& root, const Pipeline& pipeline);

// Collective over `everyone` (all ranks of all stages and replicas). Loads, in every
// stage, the newest step that every stage has intact; newer steps of a stage are
// moved aside (Checkpointer::load_latest's at_most). std::nullopt on every rank when
// some stage has none.
std::optional<checkpoint::Restored> load_agreed(checkpoint::Checkpointer& checkpointer, torch::nn::Module& model,
                                                torch::optim::Optimizer& optimizer, comm::Group& everyone,
                                                c10::Device device);

}  // namespace cohort::pipeline
