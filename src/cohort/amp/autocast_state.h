#pragma once
// Autocast's per-thread settings (enabled flag and dtype, for the CPU and CUDA), as a
// value: captured on one thread and applied on another, or later on the same one.
// ATen's ThreadLocalState carries grad mode and the dispatch keys to other threads,
// but not, in LibTorch 1.13, autocast's dtype; the threads of DataParallel and the
// recomputation of a checkpoint apply this as well.
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <vector>

namespace cohort::amp {

struct AutocastState {
  struct PerDevice {
    c10::DeviceType type;
    bool enabled;
    c10::ScalarType dtype;
  };
  std::vector<PerDevice> devices;

  static AutocastState capture();
  void apply() const;
};

}  // namespace cohort::amp
