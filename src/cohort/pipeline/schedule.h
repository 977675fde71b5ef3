#pragma once
// Pipeline schedules as explicit programs: for every pipeline rank, the ordered list
// of actions it runs in one training step (forward, backward or its two halves, and
// the point-to-point sends and receives between them). The runtime (pipeline.h)
// executes exactly this list, and the simulator (simulator.h) runs it first, so a
// schedule that would deadlock is refused before training starts.
//
//   auto s = cohort::pipeline::make_schedule(cohort::pipeline::ScheduleOptions()
//                .kind(ScheduleKind::k1F1B).ranks(4).microbatches(8));
//   for (const auto& a : s.actions[rank]) std::cout << to_string(a) << "\n";
//
// Stages are numbered globally, 0 .. ranks * virtual_stages - 1. Stage s lives on
// rank s % ranks as that rank's chunk s / ranks (Note [Interleaved placement]), so
// with one virtual stage per rank, stage s is rank s.
#include <torch/arg.h>

#include <string>
#include <vector>

namespace cohort::pipeline {

enum class ScheduleKind {
  kGPipe,        // all forwards, then all backwards
  k1F1B,         // warm-up forwards, then one forward one backward, then cool-down
  kInterleaved,  // 1F1B over several virtual stages (chunks) per rank (Megatron-LM)
  kZeroBubble,   // ZB1P (ZB-H1): backward split into input- and weight-gradient passes
};

// "gpipe", "1f1b", "interleaved", "zero-bubble" (also "zb1p"); ConfigError otherwise.
ScheduleKind parse_schedule_kind(const std::string& name);
std::string to_string(ScheduleKind kind);

enum class ActionKind {
  kForward,         // F: run the stage's forward on the micro-batch (the last stage adds the loss)
  kBackward,        // B: input and weight gradients at once
  kBackwardInput,   // I: gradients of the stage's inputs only (ZB1P); the graph is kept
  kBackwardWeight,  // W: gradients of the stage's parameters (ZB1P), after I
  kSendActivation,  // the outputs of F(stage, mb) to stage + 1's rank
  kRecvActivation,  // the inputs of F(stage, mb) from stage - 1's rank
  kSendGradient,    // the input gradients of B/I(stage, mb) to stage - 1's rank
  kRecvGradient,    // the output gradients for B/I(stage, mb) from stage + 1's rank
};

struct Action {
  ActionKind kind;
  int stage;       // the global stage this rank runs the action for
  int microbatch;  // 0 .. microbatches - 1
  bool operator==(const Action& o) const {
    return kind == o.kind && stage == o.stage && microbatch == o.microbatch;
  }
};

// "F3@s1" style: kind letter (F, B, I, W, SA, RA, SG, RG), micro-batch, stage.
std::string to_string(const Action& action);

struct ScheduleOptions {
  TORCH_ARG(ScheduleKind, kind) = ScheduleKind::k1F1B;
  TORCH_ARG(int, ranks) = 1;           // pipeline ranks (physical stages)
  TORCH_ARG(int, microbatches) = 1;    // per training step
  TORCH_ARG(int, virtual_stages) = 1;  // chunks per rank; > 1 only for kInterleaved
};

struct Schedule {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int ranks = 1;
  int microbatches = 1;
  int virtual_stages = 1;
  // actions[r]: what pipeline rank r runs in one step, in order.
  std::vector<std::vector<Action>> actions;

  int stages() const { return ranks * virtual_stages; }
  int rank_of(int stage) const { return stage % ranks; }
  int chunk_of(int stage) const { return stage / ranks; }
  bool split_backward() const { return kind == ScheduleKind::kZeroBubble; }
};

// Builds the schedule's per-rank action lists, with a send after every forward or
// backward whose result another rank needs and a receive just before the action that
// needs it. Throws ConfigError naming the numbers and the fix for settings the
// schedule cannot run: a non-positive count, 1F1B or zero-bubble with fewer
// micro-batches than ranks, interleaved with micro-batches not a multiple of ranks,
// virtual stages other than 1 outside interleaved.
Schedule make_schedule(const ScheduleOptions& options);

}  // namespace cohort::pipeline
