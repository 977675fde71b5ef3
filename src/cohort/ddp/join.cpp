#include "cohort/ddp/join.h"

#include <ATen/ATen.h>

#include <vector>

namespace cohort::ddp {

at::Tensor encode_join_round(int world_size, int rank, bool active, bool grad_enabled, bool sync,
                             bool sync_buffers) {
  std::vector<int> slots(world_size + 3, 0);
  if (active) {
    slots[rank] = 1;
    slots[world_size] = grad_enabled ? 1 : 0;
    slots[world_size + 1] = sync ? 1 : 0;
    slots[world_size + 2] = sync_buffers ? 1 : 0;
  }
  return at::tensor(slots, at::TensorOptions().dtype(at::kInt));
}

JoinRound decode_join_round(const at::Tensor& summed, int world_size) {
  auto t = summed.cpu().contiguous();
  const int* slots = t.data_ptr<int>();
  JoinRound round;
  for (int r = 0; r < world_size; ++r)
    if (slots[r] > 0) round.active_ranks.push_back(r);
  round.grad_enabled = slots[world_size] > 0;
  round.sync = slots[world_size + 1] > 0;
  round.sync_buffers = slots[world_size + 2] > 0;
  return round;
}

}  // namespace cohort::ddp
