#include "cohort/checkpoint/rng_state.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <mutex>

namespace cohort::checkpoint {
namespace {

std::vector<c10::Device> devices_of(c10::Device device) {
  std::vector<c10::Device> out{c10::Device(c10::kCPU)};
  if (device.is_cuda()) out.push_back(device.has_index() ? device : c10::Device(c10::kCUDA, 0));
  return out;
}

}  // namespace

std::vector<at::Tensor> capture_rng_state(c10::Device device) {
  std::vector<at::Tensor> out;
  for (const auto& d : devices_of(device)) {
    at::Generator gen = at::globalContext().defaultGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    out.push_back(gen.get_state());
  }
  return out;
}

void restore_rng_state(c10::Device device, const std::vector<at::Tensor>& state) {
  const auto devices = devices_of(device);
  TORCH_CHECK(state.size() == devices.size(), "restore_rng_state: expected ", devices.size(),
              " generator states for ", device, ", got ", state.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    at::Generator gen = at::globalContext().defaultGenerator(devices[i]);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state[i]);
  }
}

}  // namespace cohort::checkpoint
