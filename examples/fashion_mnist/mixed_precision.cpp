#include "mixed_precision.h"

#include <fmt/format.h>

#include "cohort/errors.h"

namespace fashion_mnist {

namespace {
constexpr const char* kScalerKey = "grad_scaler";
}

MixedPrecision::MixedPrecision(const TrainerOptions& o, c10::Device device, cohort::comm::Group group)
    : dtype_(cohort::amp::parse_amp_dtype(o.amp)),
      device_type_(device.type()),
      scaler_(cohort::amp::GradScalerOptions().enabled(dtype_ == c10::ScalarType::Half), std::move(group)) {
  if (dtype_ == c10::ScalarType::Half && device.is_cpu())
    throw cohort::ConfigError("--amp fp16 needs a CUDA device (the CPU runs autocast in bfloat16); use --amp bf16 on "
                              "the CPU, or --device cuda");
  autocast();  // refuses what autocast cannot do here, at start rather than mid-step
}

std::unique_ptr<cohort::amp::Autocast> MixedPrecision::autocast() const {
  if (!dtype_) return nullptr;
  return std::make_unique<cohort::amp::Autocast>(cohort::amp::AutocastOptions(device_type_).dtype(*dtype_));
}

bool MixedPrecision::step(torch::optim::Optimizer& optimizer) {
  const bool stepped = scaler_.step(optimizer);
  scaler_.update();
  if (!stepped) ++skipped_;
  return stepped;
}

void MixedPrecision::save(cohort::checkpoint::TrainingProgress& progress) const {
  if (scaler_.is_enabled()) progress.extra[kScalerKey] = scaler_.state_dict();
}

void MixedPrecision::restore(const cohort::checkpoint::TrainingProgress& progress) {
  if (!scaler_.is_enabled()) return;
  const auto it = progress.extra.find(kScalerKey);
  // A checkpoint of a run without fp16 has no scaler: it starts at init_scale.
  if (it == progress.extra.end()) return;
  if (!it->second.isGenericDict())
    throw cohort::DataError("the checkpoint's grad_scaler state is not a dict; it was not written by cohort");
  scaler_.load_state_dict(it->second.toGenericDict());
}

}  // namespace fashion_mnist
