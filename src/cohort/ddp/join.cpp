#include "cohort/ddp/join.h"

#include <ATen/ATen.h>

namespace cohort::ddp {

at::Tensor encode_join_round(int world_size, int rank, bool active, bool grad_enabled, bool sync) {
  auto t = at::zeros({world_size + 2}, at::TensorOptions().dtype(at::kInt));
  if (active) {
    t[rank] = 1;
    t[world_size] = grad_enabled ? 1 : 0;
    t[world_size + 1] = sync ? 1 : 0;
  }
  return t;
}

JoinRound decode_join_round(const at::Tensor& summed, int world_size) {
  auto t = summed.cpu();
  JoinRound round;
  for (int r = 0; r < world_size; ++r)
    if (t[r].item<int>() > 0) round.active_ranks.push_back(r);
  round.grad_enabled = t[world_size].item<int>() > 0;
  round.sync = t[world_size + 1].item<int>() > 0;
  return round;
}

}  // namespace cohort::ddp
