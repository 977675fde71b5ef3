#include "cohort/amp/autocast_state.h"

#include "cohort/compat/autocast.h"

namespace cohort::amp {

AutocastState AutocastState::capture() {
  AutocastState s;
  for (auto type : {c10::DeviceType::CPU, c10::DeviceType::CUDA})
    s.devices.push_back({type, compat::autocast_enabled(type), compat::autocast_dtype(type)});
  return s;
}

void AutocastState::apply() const {
  for (const auto& d : devices) {
    compat::set_autocast_enabled(d.type, d.enabled);
    compat::set_autocast_dtype(d.type, d.dtype);
  }
}

}  // namespace cohort::amp
