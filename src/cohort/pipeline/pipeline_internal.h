#pragma once
// The state of one Pipeline step (Pipeline::Slot, Pipeline::Run), shared by the
// files that implement Pipeline. Internal: not installed, included by pipeline*.cpp only.
#include <ATen/ATen.h>

#include <chrono>
#include <map>
#include <utility>
#include <vector>

#include "cohort/pipeline/pipeline.h"
#include "cohort/pipeline/wire.h"

namespace cohort::pipeline {

using Clock = std::chrono::steady_clock;

// The state of one (stage, micro-batch) during a step.
struct Pipeline::Slot {
  TensorList inputs;        // leaves for stages > 0 (as_stage_inputs), data for stage 0
  TensorList outputs;       // with their graph, until backward
  at::Tensor loss;          // last stage: the weighted loss, the root of backward
  TensorList output_grads;  // received, or handed over by the local next stage
  TensorList input_grads;   // produced by B/I, until sent or handed over
  std::vector<at::Tensor> rng;  // recompute: the generators before forward
  bool live = false;
};

struct Pipeline::Run {
  const std::vector<TensorList>* inputs = nullptr;
  const std::vector<TensorList>* targets = nullptr;
  std::vector<double> weights;
  double loss_scale = 1.0;
  std::map<std::pair<int, int>, Slot> slots;
  std::vector<Sent> sends;
  std::vector<double> losses;
  std::vector<int> backwards_done;  // per local chunk: B or W passes run this step
  std::vector<bool> started;        // per local chunk: a forward ran this step
  int live = 0;
  int peak = 0;
  double compute = 0;
};

}  // namespace cohort::pipeline
