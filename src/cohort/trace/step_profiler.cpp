#include "cohort/trace/step_profiler.h"

#include <algorithm>
#include <cstring>

namespace cohort::trace {

StepProfiler::Phase::~Phase() {
  const double end_us = Timeline::now_us();
  auto& [name, seconds] = owner_.phases_[slot_];
  seconds += (end_us - start_us_) / 1e6;
  auto* t = owner_.timeline_.get();
  if (!t || !t->recording()) return;
  t->span(name, "phase", start_us_, end_us);
  if (device_start_) t->device_span(name, "phase", std::move(device_start_), t->device_mark());
}

void StepProfiler::begin_step(std::int64_t step) {
  if (timeline_) timeline_->set_step(step);
  step_start_us_ = Timeline::now_us();
  step_device_start_ = timeline_ ? timeline_->device_mark() : nullptr;
}

StepProfiler::Phase StepProfiler::phase(const char* name) {
  auto it = std::find_if(phases_.begin(), phases_.end(),
                         [&](const auto& p) { return p.first == name || std::strcmp(p.first, name) == 0; });
  if (it == phases_.end()) {
    phases_.emplace_back(name, 0.0);
    it = phases_.end() - 1;
  }
  return Phase(*this, static_cast<std::size_t>(it - phases_.begin()));
}

void StepProfiler::end_step(double waited_s) {
  if (step_start_us_ < 0) return;
  const double end_us = Timeline::now_us();
  const double seconds = (end_us - step_start_us_) / 1e6;
  step_total_s_ += seconds;
  ++steps_;
  work_.add(std::max(0.0, seconds - waited_s));
  if (timeline_ && timeline_->recording()) {
    timeline_->span("step", "step", step_start_us_, end_us);
    if (step_device_start_)
      timeline_->device_span("step", "step", std::move(step_device_start_), timeline_->device_mark());
  }
  step_device_start_ = nullptr;
  step_start_us_ = -1;
}

std::vector<std::pair<std::string, double>> StepProfiler::phase_seconds() const {
  return {phases_.begin(), phases_.end()};
}

}  // namespace cohort::trace
