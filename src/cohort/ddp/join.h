#pragma once
// Uneven inputs: ranks that run out of batches early "join" and keep answering the
// others' collectives until every rank has run out, as PyTorch's Join does.
//
//   ddp.join([&] {
//     for (auto& batch : my_batches) {          // may be fewer on some ranks
//       auto loss = loss_fn(ddp.forward(batch.data), batch.target);
//       loss.backward();
//       optimizer.step();
//       optimizer.zero_grad();
//     }
//   });
//
// Note [Join]
// While a join is in progress, every DDP forward starts with one small all-reduce (a
// "round"): a vector with one slot per rank, set to 1 by ranks that still have data,
// plus three flags: grad enabled, gradient sync expected, and buffers broadcast
// (Note [When buffers are synchronised]). A rank whose loop ended answers each round
// with zeros, then mirrors exactly the collectives the active ranks issue in that
// step, in the same order: the bucket rebuild (if due), the buffer broadcast if
// flagged (from the highest active rank, whose buffers are current), and, when the
// step syncs gradients, the unused-parameter mask, every bucket (contributing zeros)
// and the step's status (Note [A step that failed]). A round summing to zero means all ranks have joined. Every rank sees every
// round, so all agree on which rank joined last; its parameters and buffers are
// then broadcast, so all ranks finish with the same model.
// The averaging divides by the world size (zeros from joined ranks included, as in
// PyTorch's default), or with divide_by_initial_world_size(false) by the number of
// ranks still active, i.e. the mean over the gradients actually computed.
// Caveat: while joined, every active forward with grad enabled must be followed by
// a backward, or the joined ranks wait for buckets that never come (bounded by the
// group's timeout).
#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <vector>

namespace cohort::ddp {

struct JoinOptions {
  TORCH_ARG(bool, divide_by_initial_world_size) = true;
};

// One round of Note [Join], decoded. Pure, so it is unit-tested without a group.
struct JoinRound {
  std::vector<int> active_ranks;
  bool grad_enabled = false;
  bool sync = false;
  bool sync_buffers = false;
  int active() const { return static_cast<int>(active_ranks.size()); }
  int authoritative() const { return active_ranks.empty() ? 0 : active_ranks.back(); }
};

at::Tensor encode_join_round(int world_size, int rank, bool active, bool grad_enabled, bool sync,
                             bool sync_buffers);
JoinRound decode_join_round(const at::Tensor& summed, int world_size);

}  // namespace cohort::ddp
