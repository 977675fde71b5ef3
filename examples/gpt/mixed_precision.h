#pragma once
// --amp none|bf16: autocast around the forward (cohort::amp, docs/amp.md). The loss
// is computed in fp32 from the logits, outside autocast. fp16 would need a
// GradScaler, which this example does not wire (options.cpp refuses it).
#include <c10/core/Device.h>

#include <memory>
#include <string>

#include "cohort/amp/autocast.h"

namespace gpt {

// The guard to hold over a forward; null with --amp none. ConfigError, at start,
// when the device cannot autocast to that type.
std::unique_ptr<cohort::amp::Autocast> autocast(const std::string& amp, c10::Device device);

}  // namespace gpt
