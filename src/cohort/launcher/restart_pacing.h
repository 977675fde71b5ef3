#pragma once
// How long an agent pauses before restarting failed workers, as pure logic.
//
// Note [Restart pacing]
// A program that fails at once (a typo in a path, a missing dataset) would otherwise
// burn through --max-restarts in a blink: 500 restarts of /bin/false took 5.4 s.
// torchrun waits a monitor interval each round; cohort does the same for a first
// failure, and backs off for a crash loop:
//  - a worker group that failed after running at least `quick_run` (10 s) is an
//    ordinary failure: the pause is `min_pause` (--monitor-interval), so a job that
//    trained for a while restarts at once, and the streak of quick failures resets;
//  - a group that failed sooner is a quick failure. The first in a row pauses
//    `min_pause` too; the second `first_backoff` (1 s), and each further one doubles
//    the pause, up to `max_pause` (30 s).
// So /bin/false with --max-restarts 500 pauses 0.1, 1, 2, 4, 8, 16, 30, 30, ... s.
// The agent waits out the pause on its signal pipe (Ctrl-C ends it at once, with
// 130); the elastic agent pauses before it leaves the failed round, so the next
// round starts when the slowest node's pause is over.
#include <torch/arg.h>

#include <chrono>
#include <string>

namespace cohort::launcher {

struct RestartPacingOptions {
  using Millis = std::chrono::milliseconds;
  TORCH_ARG(Millis, min_pause) = Millis(100);
  TORCH_ARG(Millis, first_backoff) = Millis(1'000);
  TORCH_ARG(Millis, max_pause) = Millis(30'000);
  TORCH_ARG(Millis, quick_run) = Millis(10'000);
};

// The options for `cohort run`: min_pause is --monitor-interval (seconds).
RestartPacingOptions restart_pacing_for(double monitor_interval);

class RestartPacing {
 public:
  using Millis = std::chrono::milliseconds;
  explicit RestartPacing(RestartPacingOptions options = {}) : options_(options) {}

  // A worker group failed after running for `ran_for`; returns the pause before
  // restarting it.
  Millis after_failure(Millis ran_for);
  // Quick failures in a row so far (0 after a group that ran long).
  int quick_failures() const { return quick_failures_; }
  // What the agent prints before waiting `pause` (a backoff); empty for the plain
  // monitor-interval pause.
  std::string explain(Millis pause) const;

 private:
  RestartPacingOptions options_;
  int quick_failures_ = 0;
};

}  // namespace cohort::launcher
