#include "cohort/trace/device_mean.h"

#include <ATen/ATen.h>

#include "cohort/errors.h"

namespace cohort::trace {

void DeviceMean::add(const at::Tensor& value) {
  if (value.numel() != 1)
    throw ConfigError("cohort DeviceMean::add: expected one value, got a tensor of shape " +
                      c10::str(value.sizes()) + "; fix: add the loss (a scalar), or its .mean()");
  auto v = value.detach().reshape({}).to(at::kDouble);
  if (!sum_.defined()) {
    sum_ = at::zeros({}, v.options());
  }
  sum_.add_(v.to(sum_.device(), /*non_blocking=*/true));
  ++count_;
}

std::optional<double> DeviceMean::take() {
  if (count_ == 0) return std::nullopt;
  const double mean = sum_.item<double>() / static_cast<double>(count_);
  sum_.zero_();
  count_ = 0;
  return mean;
}

}  // namespace cohort::trace
