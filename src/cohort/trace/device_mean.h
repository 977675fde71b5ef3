#pragma once
// The mean of a training loop's scalars (its loss) kept on their device and read
// only when someone looks: `loss.item()` every step makes the host wait for the GPU
// to finish the step, so the host cannot queue the next one while the GPU works.
//
//   cohort::trace::DeviceMean losses;
//   losses.add(loss.detach());                       // no sync: an add on the device
//   if (progress_line_due) print(losses.take());     // one sync, the mean since the last take
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace cohort::trace {

class DeviceMean {
 public:
  // Adds a one-element tensor, on any device (the first add's device keeps the sum,
  // in double).
  void add(const at::Tensor& value);
  // The mean of what was added since the last take (a host read: waits for the
  // device), and starts over; nullopt if nothing was added.
  std::optional<double> take();
  std::int64_t count() const { return count_; }

 private:
  at::Tensor sum_;
  std::int64_t count_ = 0;
};

}  // namespace cohort::trace
