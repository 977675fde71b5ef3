#pragma once
// --clip-grad-norm: the gradients scaled so that the whole model's norm is at most
// the limit, after backward and before the optimizer's step, under every split the
// trainer runs (cohort::optim::clip_grad_norm_, docs/clipping.md).
#include <ATen/core/Tensor.h>

#include <vector>

#include "cohort/comm/device_mesh.h"
#include "cohort/optim/clip_grad_norm.h"
#include "options.h"
#include "strategy.h"

namespace gpt {

// The parts this rank's gradients are in; empty without --clip-grad-norm. The
// options refuse it with --zero 2, whose optimizer finishes reducing the gradients
// inside its step, after the point where they would be clipped.
std::vector<cohort::optim::GradPart> clipping_parts(const GptTrainerOptions& o, Strategy& strategy,
                                                    cohort::comm::DeviceMesh& mesh);

}  // namespace gpt
