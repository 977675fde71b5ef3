#include "cohort/ddp/step_status.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "cohort/errors.h"

namespace cohort::ddp {

// Each rank's slot holds step * 2 + failed; the others add zeros, so the sum
// carries every rank's slot exactly.
StepStatus::StepStatus(comm::Group group, c10::Device device)
    : group_(std::move(group)), flags_(at::zeros({group_.size()}, at::TensorOptions().dtype(at::kLong).device(device))) {}

namespace {
constexpr std::uint64_t kRidingSteps = std::uint64_t{1} << 22;  // Note [The status rides in the last bucket]
}  // namespace

void StepStatus::ride_on(at::Tensor slots) {
  TORCH_INTERNAL_ASSERT(!launched_, "the status moves between steps only");
  TORCH_INTERNAL_ASSERT(!slots.defined() || slots.numel() == group_.size(), "one slot per rank");
  slots_ = std::move(slots);
}

void StepStatus::launch(bool failed, std::uint64_t step) {
  TORCH_INTERNAL_ASSERT(!launched_, "a step's status is launched once");
  if (group_.size() == 1) return;  // no peer to tell
  if (rides()) {
    slots_.zero_();
    slots_[group_.rank()].fill_(static_cast<double>((step % kRidingSteps) * 2 + (failed ? 1 : 0)));
    launched_ = true;
    return;
  }
  flags_.zero_();
  flags_[group_.rank()].fill_(static_cast<std::int64_t>(step * 2 + (failed ? 1 : 0)));
  work_ = group_.all_reduce_async(flags_);
  launched_ = true;
}

std::vector<int> StepStatus::wait() {
  if (!launched_) return {};
  launched_ = false;
  work_.wait();
  const auto& summed = rides() ? slots_ : flags_;
  auto steps = status_steps(summed);
  bool differ = false;
  for (auto s : steps) differ = differ || s != steps.front();
  if (differ) {
    std::string where;
    for (std::size_t r = 0; r < steps.size() && r < 16; ++r)
      where += fmt::format("{}rank {} in step {}", r ? ", " : "", r, steps[r]);
    if (steps.size() > 16) where += ", ...";
    throw CommError(fmt::format(
        "cohort DDP (rank {}): the ranks are in different DDP steps: {}{} (a step is a forward with grad enabled "
        "outside no_sync). Their collectives paired one step's gradients with another's, so this step's averages "
        "were discarded (Note [Steps that pair]). Cause: a rank ran a forward with grad enabled whose backward did "
        "not reach the forward's outputs (a loss that ignores them, or no backward at all), and went on to the "
        "next step alone. Fix: on every rank, follow each forward with grad enabled by a backward through its "
        "outputs, and run forwards that are not training steps under torch::NoGradGuard",
        group_.rank(), where, rides() ? " (modulo 2^22)" : ""));
  }
  return failed_ranks(summed);
}

void StepStatus::drop() {
  work_ = comm::Pending();
  if (rides()) {  // the bucket's reduction is the reducer's to drop
    launched_ = false;
    return;
  }
  flags_ = at::zeros_like(flags_);  // the dropped reduction may still write the old one
  launched_ = false;
}

std::vector<int> failed_ranks(const at::Tensor& summed) {
  auto flags = summed.to(at::kCPU, at::kLong).contiguous();
  const std::int64_t* slot = flags.data_ptr<std::int64_t>();
  std::vector<int> out;
  for (int r = 0; r < flags.numel(); ++r)
    if (slot[r] % 2 != 0) out.push_back(r);
  return out;
}

std::vector<std::uint64_t> status_steps(const at::Tensor& summed) {
  auto flags = summed.to(at::kCPU, at::kLong).contiguous();
  const std::int64_t* slot = flags.data_ptr<std::int64_t>();
  std::vector<std::uint64_t> out;
  for (int r = 0; r < flags.numel(); ++r) out.push_back(static_cast<std::uint64_t>(slot[r]) / 2);
  return out;
}

}  // namespace cohort::ddp
