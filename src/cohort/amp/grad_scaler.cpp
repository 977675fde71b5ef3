#include "cohort/amp/grad_scaler.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cohort/errors.h"

namespace cohort::amp {

namespace {

using GenericDict = c10::impl::GenericDict;

double number(const GenericDict& state, const char* key) {
  const auto it = state.find(key);
  if (it == state.end())
    throw DataError(fmt::format("cohort GradScaler: the state has no '{}'; it is not a GradScaler's state_dict", key));
  const auto& v = it->value();
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isTensor() && v.toTensor().numel() == 1) return v.toTensor().item<double>();
  throw DataError(fmt::format("cohort GradScaler: '{}' in the state is not a number", key));
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options, std::optional<comm::Group> group)
    : options_(options), group_(std::move(group)), scale_(static_cast<float>(options.init_scale())) {
  // Note [A float32 scale]: it must stay positive and finite once rounded to float32.
  if (!(options_.init_scale() > 0) || !std::isfinite(options_.init_scale()) || !(scale_ > 0) || !std::isfinite(scale_))
    throw ConfigError(fmt::format("cohort GradScaler: init_scale must be positive and finite in float32 (the scale "
                                  "is a float32, as PyTorch's), not {}",
                                  options_.init_scale()));
  if (!(options_.growth_factor() > 1.0))
    throw ConfigError(fmt::format("cohort GradScaler: growth_factor must be above 1, not {}", options_.growth_factor()));
  if (!(options_.backoff_factor() > 0 && options_.backoff_factor() < 1.0))
    throw ConfigError(fmt::format("cohort GradScaler: backoff_factor must be between 0 and 1, not {}",
                                  options_.backoff_factor()));
  if (options_.growth_interval() < 1)
    throw ConfigError(fmt::format("cohort GradScaler: growth_interval must be at least 1, not {}",
                                  options_.growth_interval()));
}

at::Tensor GradScaler::scale(const at::Tensor& loss) {
  if (!options_.enabled()) return loss;
  device_ = loss.device();
  return loss * scale_;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) return;
  auto& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::kUnscaled)
    throw ConfigError("cohort GradScaler: unscale_() was already called on this optimizer since the last update()");
  if (state.stage == Stage::kStepped)
    throw ConfigError("cohort GradScaler: unscale_() is being called after step(); call update() first");
  // Note [Exact unscaling]: the reciprocal of a power of two is exact in float, so
  // multiplying by it gives bitwise the gradient an unscaled backward would have
  // (barring values that under- or overflowed while scaled).
  // As PyTorch's: the reciprocal in double, rounded to float32 (Note [A float32 scale]).
  const float inv = static_cast<float>(1.0 / static_cast<double>(scale_));
  // Every gradient is checked before any is changed: a refusal leaves them as they were.
  std::size_t index = 0, with_grad = 0;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) {
      ++index;
      if (!p.grad().defined()) continue;
      ++with_grad;
      if (p.grad().scalar_type() == at::kHalf)
        throw ConfigError(fmt::format(
            "cohort GradScaler: parameter {} of the optimizer has a float16 gradient; unscaling it would lose "
            "precision. Keep the parameters in float32 and let autocast run the operations in float16",
            index - 1));
    }
  if (with_grad == 0 && !(group_ && group_->size() > 1))
    throw ConfigError("cohort GradScaler: none of the optimizer's parameters has a gradient; call "
                      "scaler.scale(loss).backward() before unscale_() or step()");
  std::vector<std::pair<c10::Device, at::Tensor>> bad;  // per device: any non-finite gradient there
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      auto& g = p.mutable_grad();
      if (!g.defined()) continue;
      if (g.is_sparse()) g = g.coalesce();
      auto values = g.is_sparse() ? g._values() : g;
      auto here = at::logical_not(at::isfinite(values)).any();
      auto it = std::find_if(bad.begin(), bad.end(), [&](const auto& b) { return b.first == g.device(); });
      if (it == bad.end()) bad.emplace_back(g.device(), here);
      else it->second = at::logical_or(it->second, here);
      values.mul_(inv);
      if (!device_) device_ = g.device();
    }
  }
  bool found = false;
  for (const auto& [device, flag] : bad) found = found || flag.item<bool>();
  // Note [Agreeing on overflow]
  if (group_ && group_->size() > 1) {
    auto flag = at::full({1}, found ? 1.0 : 0.0, at::TensorOptions().dtype(at::kFloat).device(device_.value_or(c10::kCPU)));
    group_->all_reduce(flag, comm::ReduceOp::kMax);
    found = flag.item<float>() > 0;
  }
  state.found_inf = found;
  state.stage = Stage::kUnscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return true;
  }
  auto& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::kStepped)
    throw ConfigError("cohort GradScaler: step() was already called on this optimizer since the last update()");
  if (state.stage == Stage::kReady) unscale_(optimizer);
  auto& after = per_optimizer_[&optimizer];
  after.stage = Stage::kStepped;
  if (after.found_inf) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  if (per_optimizer_.empty())
    throw ConfigError("cohort GradScaler: update() without a step() or unscale_() since the last update(); call "
                      "scaler.step(optimizer) first");
  bool found = false;
  for (const auto& [optimizer, state] : per_optimizer_) found = found || state.found_inf;
  per_optimizer_.clear();
  // As PyTorch's _amp_update_scale_, whose scale is a float32 tensor: growth that
  // would overflow float32 leaves the scale where it is.
  if (found) {
    scale_ = static_cast<float>(static_cast<double>(scale_) * options_.backoff_factor());
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ < options_.growth_interval()) return;
  const float grown = static_cast<float>(static_cast<double>(scale_) * options_.growth_factor());
  if (std::isfinite(grown)) scale_ = grown;
  growth_tracker_ = 0;
}

c10::impl::GenericDict GradScaler::state_dict() const {
  GenericDict state(c10::StringType::get(), c10::AnyType::get());
  if (!options_.enabled()) return state;
  state.insert("scale", static_cast<double>(scale_));
  state.insert("growth_factor", options_.growth_factor());
  state.insert("backoff_factor", options_.backoff_factor());
  state.insert("growth_interval", options_.growth_interval());
  state.insert("_growth_tracker", growth_tracker_);
  return state;
}

void GradScaler::load_state_dict(const c10::impl::GenericDict& state) {
  if (!options_.enabled()) return;
  if (state.empty())
    throw DataError("cohort GradScaler: the state is empty; it was saved by a disabled GradScaler (--amp other "
                    "than fp16?). Load it into a disabled one, or start the scaler afresh");
  const double scale = number(state, "scale"), growth = number(state, "growth_factor"),
               backoff = number(state, "backoff_factor"), interval = number(state, "growth_interval"),
               tracker = number(state, "_growth_tracker");
  auto refuse = [](const char* key, double value, const char* want) {
    throw DataError(fmt::format("cohort GradScaler: the state's {} is {}; it must be {}. The state is damaged or "
                                "not a GradScaler's",
                                key, value, want));
  };
  // The constructor's checks, so a loaded scaler behaves as a constructed one.
  const float scale32 = static_cast<float>(scale);  // Note [A float32 scale]
  if (!(scale32 > 0) || !std::isfinite(scale32)) refuse("scale", scale, "positive and finite in float32");
  if (!(growth > 1.0) || !std::isfinite(growth)) refuse("growth_factor", growth, "above 1");
  if (!(backoff > 0 && backoff < 1.0)) refuse("backoff_factor", backoff, "between 0 and 1");
  if (!(interval >= 1) || interval != std::floor(interval)) refuse("growth_interval", interval, "an integer of at least 1");
  if (!(tracker >= 0 && tracker < interval) || tracker != std::floor(tracker))
    refuse("_growth_tracker", tracker, "an integer from 0 to growth_interval - 1");
  options_.growth_factor(growth);
  options_.backoff_factor(backoff);
  options_.growth_interval(static_cast<std::int64_t>(interval));
  scale_ = scale32;
  growth_tracker_ = static_cast<std::int64_t>(tracker);
  per_optimizer_.clear();
}

}  // namespace cohort::amp
