#pragma once
// Runs a schedule's action lists (schedule.h) without a model: each rank executes its
// list in order; a receive waits for the matching send (sends never wait: the runtime
// posts them asynchronously); F, B, I and W wait for what they consume. Before
// training the runtime simulates its schedule, so a list that would deadlock is
// refused with the rank and the action that would wait forever; the same run gives
// the schedule's bubble for the given costs.
//
//   auto r = simulate(schedule, SimulationCosts().forward(1).backward_input(1).backward_weight(1));
//   r.bubble_fraction;   // idle time / (ranks * makespan)
#include <torch/arg.h>

#include <vector>

#include "cohort/pipeline/schedule.h"

namespace cohort::pipeline {

// The time one stage (one virtual stage under interleaving) takes per micro-batch.
// A plain backward (B) costs backward_input + backward_weight.
struct SimulationCosts {
  TORCH_ARG(double, forward) = 1;
  TORCH_ARG(double, backward_input) = 1;
  TORCH_ARG(double, backward_weight) = 1;
  // Added between a send and the matching receive completing.
  TORCH_ARG(double, transfer) = 0;
};

struct SimulationResult {
  double makespan = 0;                 // from the first action to the last
  std::vector<double> busy;            // per rank: time spent in F, B, I and W
  double bubble_fraction = 0;          // idle / (ranks * makespan)
  double bubble_ratio = 0;             // idle / busy: Megatron-LM's "bubble time fraction"
  // Per rank: the most micro-batches whose forward has run and whose backward (or,
  // split, whose W) has not, summed over the rank's chunks: the activations it holds.
  std::vector<int> peak_activations;
};

// Throws ConfigError when the lists cannot run to the end: a
// receive with no matching send, an action whose input was never produced on this
// rank, an action missing or repeated, or a cycle of waits. The message names the
// rank, the action and what it waits for, e.g.
//   "rank 1 would wait forever at RA2@s1 (micro-batch 2's activation from stage 0 on
//    rank 0), while rank 0 waits at RG0@s0 ..."
SimulationResult simulate(const Schedule& schedule, const SimulationCosts& costs = SimulationCosts());

// The bubble the literature gives for each schedule, in the convention it uses:
// GPipe and 1F1B: fraction (p-1)/(m+p-1); interleaved: ratio (p-1)/(v*m);
// zero-bubble (ZB-H1 with equal F, I, W): ratio (p-1)/(3m).
struct FormulaBubble {
  double value = 0;
  bool is_ratio = false;  // compare with bubble_ratio, else with bubble_fraction
};
FormulaBubble formula_bubble(const Schedule& schedule);

}  // namespace cohort::pipeline
