#include "cohort/ddp/broadcast.h"

#include <ATen/ATen.h>
#include <torch/csrc/utils/tensor_flatten.h>

#include <map>
#include <string>
#include <utility>

namespace cohort::ddp {

void broadcast_coalesced(comm::Group& group, const std::vector<at::Tensor>& tensors, int root) {
  if (tensors.empty() || group.size() == 1) return;
  at::NoGradGuard no_grad;
  // std::map keeps the groups in the same order on every rank.
  std::map<std::pair<std::string, std::string>, std::vector<at::Tensor>> by_kind;
  for (const auto& t : tensors)
    by_kind[{std::string(c10::toString(t.scalar_type())), t.device().str()}].push_back(t);
  for (auto& [kind, members] : by_kind) {
    auto flat = torch::utils::flatten_dense_tensors(members);
    group.broadcast(flat, root);
    auto parts = torch::utils::unflatten_dense_tensors(flat, members);
    for (std::size_t i = 0; i < members.size(); ++i) members[i].copy_(parts[i]);
  }
}

}  // namespace cohort::ddp
