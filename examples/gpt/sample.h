#pragma once
// Text sampled from the model at the end of training.
//
// Note [Sampling in lockstep]
// Every rank runs the same forwards: the TP ranks must (each forward has TP
// collectives), and under --zero 3 so must the data-parallel replicas. Each rank
// gathers the last position's logit slices over the TP group into the whole
// vocabulary's logits and draws from its own generator, seeded alike on every rank,
// so that every rank picks the same token and the next forward is the same
// everywhere. The window is always the full context, the tokens so far at its start
// and end-of-text ids after them: attention is causal, so the padding changes
// nothing before it, and sequence parallelism's shards stay whole.
// With a pipeline (--pp > 1) every rank runs Pipeline::forward; only the last
// stage's ranks get logit slices, which they gather over their TP group and draw
// from. The last stage of data replica 0 and TP rank 0 then broadcasts its token
// over the world, so that every rank feeds the same window next.
#include <c10/core/Device.h>

#include <string>
#include <vector>

#include "cohort/comm/device_mesh.h"
#include "cohort/comm/world.h"
#include "options.h"
#include "strategy.h"
#include "tokenizer.h"

namespace gpt {

// Collective over the world. Each sample starts after an end-of-text id (the start
// of a fortune) and stops at the next one or after o.sample_tokens tokens.
std::vector<std::string> sample_texts(Strategy& strategy, const Tokenizer& tokenizer, int vocab_size, int eos_id,
                                      const GptTrainerOptions& o, const cohort::comm::World& world,
                                      cohort::comm::DeviceMesh& mesh,
                                      c10::Device device);

}  // namespace gpt
