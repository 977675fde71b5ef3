#include "cohort/amp/autocast.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include "cohort/compat/autocast.h"
#include "cohort/errors.h"

namespace cohort::amp {

std::optional<c10::ScalarType> parse_amp_dtype(const std::string& name) {
  if (name == "bf16") return c10::ScalarType::BFloat16;
  if (name == "fp16") return c10::ScalarType::Half;
  if (name == "off") return std::nullopt;
  throw ConfigError(fmt::format("'{}' is not a mixed-precision mode; use bf16, fp16 or off", name));
}

namespace {

c10::ScalarType checked_dtype(const AutocastOptions& o) {
  const bool cpu = o.device_type() == c10::DeviceType::CPU;
  if (!cpu && o.device_type() != c10::DeviceType::CUDA)
    throw ConfigError(fmt::format("cohort autocast: no autocast for device type {}; use CPU (bfloat16) or CUDA "
                                  "(float16 or bfloat16)",
                                  c10::DeviceTypeName(o.device_type())));
  const auto dtype = o.dtype().value_or(cpu ? c10::ScalarType::BFloat16 : c10::ScalarType::Half);
  if (cpu && dtype != c10::ScalarType::BFloat16)
    throw ConfigError(fmt::format("cohort autocast: the CPU runs autocast in bfloat16 only, not {}; use bf16 there "
                                  "(fp16 with a GradScaler is for CUDA)",
                                  c10::toString(dtype)));
  if (!cpu && dtype != c10::ScalarType::Half && dtype != c10::ScalarType::BFloat16)
    throw ConfigError(fmt::format("cohort autocast: CUDA autocast lowers to float16 or bfloat16, not {}",
                                  c10::toString(dtype)));
  return dtype;
}

}  // namespace

Autocast::Autocast(AutocastOptions options)
    : device_(options.device_type()),
      was_enabled_(compat::autocast_enabled(device_)),
      previous_dtype_(compat::autocast_dtype(device_)),
      previous_cache_(at::autocast::is_autocast_cache_enabled()) {
  const auto dtype = checked_dtype(options);
  compat::set_autocast_enabled(device_, options.enabled());
  compat::set_autocast_dtype(device_, dtype);
  // Note [Nested cast cache]: on only where the guard asks and the caller had it on.
  at::autocast::set_autocast_cache_enabled(options.cache_enabled() && previous_cache_);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  // As Python's torch.autocast.__exit__: the outermost exit drops the cached casts.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_enabled(device_, was_enabled_);
  compat::set_autocast_dtype(device_, previous_dtype_);
  at::autocast::set_autocast_cache_enabled(previous_cache_);
}

}  // namespace cohort::amp
