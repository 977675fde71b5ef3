#include "mixed_precision.h"

namespace gpt {

std::unique_ptr<cohort::amp::Autocast> autocast(const std::string& amp, c10::Device device) {
  if (amp == "none") return nullptr;
  return std::make_unique<cohort::amp::Autocast>(
      cohort::amp::AutocastOptions(device.type()).dtype(cohort::amp::parse_amp_dtype(amp)));
}

}  // namespace gpt
