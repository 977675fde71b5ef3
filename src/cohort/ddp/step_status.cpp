#include "cohort/ddp/step_status.h"

#include <ATen/ATen.h>

namespace cohort::ddp {

StepStatus::StepStatus(comm::Group group, c10::Device device)
    : group_(std::move(group)), flags_(at::zeros({group_.size()}, at::TensorOptions().dtype(at::kInt).device(device))) {}

void StepStatus::launch(bool failed) {
  TORCH_INTERNAL_ASSERT(!launched_, "a step's status is launched once");
  if (group_.size() == 1) return;  // no peer to tell
  flags_.zero_();
  if (failed) flags_[group_.rank()].fill_(1);
  work_ = group_.all_reduce_async(flags_);
  launched_ = true;
}

std::vector<int> StepStatus::wait() {
  if (!launched_) return {};
  launched_ = false;
  work_.wait();
  return failed_ranks(flags_);
}

void StepStatus::drop() {
  work_ = comm::Pending();
  flags_ = at::zeros_like(flags_);  // the dropped reduction may still write the old one
  launched_ = false;
}

std::vector<int> failed_ranks(const at::Tensor& summed) {
  auto flags = summed.cpu().contiguous();
  const int* slot = flags.data_ptr<int>();
  std::vector<int> out;
  for (int r = 0; r < flags.numel(); ++r)
    if (slot[r] > 0) out.push_back(r);
  return out;
}

}  // namespace cohort::ddp
