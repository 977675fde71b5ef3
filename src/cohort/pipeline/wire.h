#pragma once
// Lists of tensors between pipeline ranks, with their shapes and dtypes on the wire,
// so stages never declare what they exchange and a micro-batch may differ in shape
// from the one before (a sequence length, a last short batch).
//
// Note [Shapes on the wire]
// Every transfer is a fixed-size int64 header followed by one message per defined
// tensor. The header holds the count, then for each tensor its dtype (-1 for an
// undefined tensor: an input that gets no gradient) and its sizes. Each message has
// its own tag (transfer_tag), built from the micro-batch, the stage, the direction
// and the slot, so Gloo matches a receive to its send whatever order the two ranks
// reach them in. The tag's micro-batch field wraps at 2^14; messages with equal
// tags between one pair of ranks arrive in the order they were sent, so reuse
// across steps is safe. NCCL ignores tags and matches in issue order; the runtime
// issues sends and receives between a pair in schedule order, which both sides share.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

#include "cohort/comm/group.h"

namespace cohort::pipeline {

enum class Direction { kActivation = 0, kGradient = 1 };

// The most tensors one transfer carries, and the most sizes all of them have together.
inline constexpr int kMaxWireTensors = 64;
inline constexpr int kHeaderSlots = 256;

int transfer_tag(Direction direction, int stage, int microbatch, int slot);

// Sends `tensors` (each made contiguous; undefined ones allowed) to group rank `dst`;
// the header goes from `device` (the stage's device: NCCL moves CUDA tensors only).
// The caller waits for `pending` before the step ends; `keep` holds the data until then.
struct Sent {
  std::vector<comm::Pending> pending;
  std::vector<at::Tensor> keep;
};
Sent send_tensors(comm::Group& group, const std::vector<at::Tensor>& tensors, int dst,
                                        Direction direction, int stage, int microbatch, c10::Device device);

// Receives what send_tensors sent, allocating each tensor on `device`.
std::vector<at::Tensor> recv_tensors(comm::Group& group, int src, Direction direction, int stage, int microbatch,
                                     c10::Device device);

}  // namespace cohort::pipeline
