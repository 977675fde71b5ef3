#pragma once
// Broadcasts many tensors with few collectives: tensors are grouped by dtype and
// device, each group is flattened into one buffer, broadcast, and copied back. DDP
// uses it for parameters at construction and for buffers before each forward.
#include <ATen/core/Tensor.h>

#include <vector>

#include "cohort/comm/group.h"

namespace cohort::ddp {

// Every rank passes tensors of the same shapes, dtypes and order; `root` is a group
// rank. Writes root's values into the tensors in place, without recording autograd.
void broadcast_coalesced(comm::Group& group, const std::vector<at::Tensor>& tensors, int root);

}  // namespace cohort::ddp
