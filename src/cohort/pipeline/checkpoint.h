#pragma once
// Checkpoints of a pipeline: each stage saves its own parameters and optimizer state
// through the ordinary checkpointer (checkpoint/checkpointer.h), in a directory of
// its own, over its data-parallel group (whose rank 0 writes). Resuming must pick the
// same step in every stage, even when a stage died between its save and another's,
// and must refuse checkpoints cut for another layout of stages:
//
//   Checkpointer ckpt(stage_directory(root, pipe), mesh.data_group());
//   auto restored = load_agreed(root, pipe, ckpt, opt, world.group(), device);
//   ...
//   ckpt.save(*pipe.local_module(), opt, progress, device);   // every stage, same steps
#include <optional>
#include <string>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/pipeline/pipeline.h"

namespace cohort::pipeline {

// root/stage-<s>, s being the first stage this rank holds.
std::string stage_directory(const std::string& root, const Pipeline& pipeline);

// root/pipeline.json: the layout (pipeline ranks, virtual stages) that wrote the
// checkpoints under root.
std::string layout_path(const std::string& root);

// Collective over `everyone` (all ranks of all stages and replicas).
// First checks root/pipeline.json against this pipeline's layout: when checkpoints
// exist and were written by another layout, or by a run without a pipeline
// (root/step-N), throws ConfigError on every rank, naming both layouts, and moves
// nothing. Otherwise records the layout there, then loads,
// in every stage, the newest step that every stage has intact; newer steps of a stage
// are moved aside (Checkpointer::load_latest's at_most). std::nullopt on every rank
// when some stage has none.
std::optional<checkpoint::Restored> load_agreed(const std::string& root, const Pipeline& pipeline,
                                                checkpoint::Checkpointer& checkpointer,
                                                torch::optim::Optimizer& optimizer, comm::Group& everyone,
                                                c10::Device device);

// For a run without a pipeline on `root`: throws ConfigError, naming the pipeline
// layout found, when root holds stage checkpoints (which it cannot resume). Each rank
// checks the directory itself.
void refuse_pipeline_checkpoints(const std::string& root);

}  // namespace cohort::pipeline
