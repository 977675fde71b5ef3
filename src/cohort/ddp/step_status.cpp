#include "cohort/ddp/step_status.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "cohort/errors.h"

namespace cohort::ddp {

// Each rank's slot holds step * 2 + failed; the others add zeros, so the sum
// carries every rank's slot exactly.
StepStatus::StepStatus(comm::Group group, c10::Device device)
    : group_(std::move(group)), flags_(at::zeros({group_.size()}, at::TensorOptions().dtype(at::kLong).device(device))) {}

void StepStatus::launch(bool failed, std::uint64_t step) {
  TORCH_INTERNAL_ASSERT(!launched_, "a step's status is launched once");
  if (group_.size() == 1) return;  // no peer to tell
  flags_.zero_();
  flags_[group_.rank()].fill_(static_cast<std::int64_t>(step * 2 + (failed ? 1 : 0)));
  work_ = group_.all_reduce_async(flags_);
  launched_ = true;
}

std::vector<int> StepStatus::wait() {
  if (!launched_) return {};
  launched_ = false;
  work_.wait();
  auto steps = status_steps(flags_);
  bool differ = false;
  for (auto s : steps) differ = differ || s != steps.front();
  if (differ) {
    std::string where;
    for (std::size_t r = 0; r < steps.size() && r < 16; ++r)
      where += fmt::format("{}rank {} in step {}", r ? ", " : "", r, steps[r]);
    if (steps.size() > 16) where += ", ...";
    throw CommError(fmt::format(
        "cohort DDP (rank {}): the ranks are in different DDP steps: {} (a step is a forward with grad enabled "
        "outside no_sync). Their collectives paired one step's gradients with another's, so this step's averages "
        "were discarded (Note [Steps that pair]). Cause: a rank ran a forward with grad enabled whose backward did "
        "not reach the forward's outputs (a loss that ignores them, or no backward at all), and went on to the "
        "next step alone. Fix: on every rank, follow each forward with grad enabled by a backward through its "
        "outputs, and run forwards that are not training steps under torch::NoGradGuard",
        group_.rank(), where));
  }
  return failed_ranks(flags_);
}

void StepStatus::drop() {
  work_ = comm::Pending();
  flags_ = at::zeros_like(flags_);  // the dropped reduction may still write the old one
  launched_ = false;
}

std::vector<int> failed_ranks(const at::Tensor& summed) {
  auto flags = summed.cpu().contiguous();
  const std::int64_t* slot = flags.data_ptr<std::int64_t>();
  std::vector<int> out;
  for (int r = 0; r < flags.numel(); ++r)
    if (slot[r] % 2 != 0) out.push_back(r);
  return out;
}

std::vector<std::uint64_t> status_steps(const at::Tensor& summed) {
  auto flags = summed.cpu().contiguous();
  const std::int64_t* slot = flags.data_ptr<std::int64_t>();
  std::vector<std::uint64_t> out;
  for (int r = 0; r < flags.numel(); ++r) out.push_back(static_cast<std::uint64_t>(slot[r]) / 2);
  return out;
}

}  // namespace cohort::ddp
