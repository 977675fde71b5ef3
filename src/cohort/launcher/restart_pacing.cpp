#include "cohort/launcher/restart_pacing.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace cohort::launcher {

RestartPacingOptions restart_pacing_for(double monitor_interval) {
  const auto ms = static_cast<std::int64_t>(std::llround(std::max(monitor_interval, 0.0) * 1000.0));
  return RestartPacingOptions().min_pause(std::chrono::milliseconds(ms));
}

// Note [Restart pacing].
RestartPacing::Millis RestartPacing::after_failure(Millis ran_for) {
  if (ran_for >= options_.quick_run()) {
    quick_failures_ = 0;
    return options_.min_pause();
  }
  ++quick_failures_;
  if (quick_failures_ == 1) return options_.min_pause();
  Millis pause = options_.first_backoff();
  for (int i = 2; i < quick_failures_ && pause < options_.max_pause(); ++i) pause *= 2;
  return std::max(options_.min_pause(), std::min(pause, options_.max_pause()));
}

std::string RestartPacing::explain(Millis pause) const {
  if (quick_failures_ < 2) return "";
  return fmt::format("cohort run: the workers failed {} times in a row within {:.0f} s of starting; waiting {:.1f} s "
                     "before the restart (Note [Restart pacing])\n",
                     quick_failures_, std::chrono::duration<double>(options_.quick_run()).count(),
                     std::chrono::duration<double>(pause).count());
}

}  // namespace cohort::launcher
