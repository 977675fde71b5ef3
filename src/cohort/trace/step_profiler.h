#pragma once
// Times a training loop's steps and their phases on one rank. It keeps the step
// times for the straggler report (trace/straggler.h), sums each phase for a
// profile of where a step goes, and draws both on the timeline when there is one
// (on a GPU, also where the device ran them: Note [Device time on the host's clock]).
// Off the timeline it reads the clock twice per phase and allocates nothing.
//
//   cohort::trace::StepProfiler profiler(cohort::trace::timeline_of(world));
//   for (...) {
//     profiler.begin_step(step);
//     { auto p = profiler.phase("data wait"); batch = next(); }
//     { auto p = profiler.phase("forward"); ... }
//     profiler.end_step(/*waited_s=*/ddp_wait);   // time not spent on this rank's own work
//   }
//   profiler.profile();   // {"forward": 0.41, ...} share of the step time
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cohort/trace/step_stats.h"
#include "cohort/trace/timeline.h"

namespace cohort::trace {

class StepProfiler {
 public:
  explicit StepProfiler(std::shared_ptr<Timeline> timeline = nullptr) : timeline_(std::move(timeline)) {}

  class Phase {
   public:
    Phase(StepProfiler& owner, std::size_t slot)
        : owner_(owner),
          slot_(slot),
          start_us_(Timeline::now_us()),
          device_start_(owner.timeline_ ? owner.timeline_->device_mark() : nullptr) {}
    ~Phase();
    Phase(const Phase&) = delete;
    Phase& operator=(const Phase&) = delete;

   private:
    StepProfiler& owner_;
    std::size_t slot_;
    double start_us_;
    std::shared_ptr<comm::DeviceMark> device_start_;  // Note [Device time on the host's clock]
  };

  void begin_step(std::int64_t step);
  // `name` must outlive the profiler (a string literal).
  Phase phase(const char* name);
  // Ends the step. `waited_s` is time inside it spent waiting for other ranks (DDP's
  // wait for the last buckets), left out of the straggler report's step times.
  void end_step(double waited_s = 0);

  // The steps' own-work times, for gather_straggler_report().
  const StepTimes& work_times() const { return work_; }
  // Seconds per phase summed over the steps, and the steps' total.
  std::vector<std::pair<std::string, double>> phase_seconds() const;
  double step_seconds() const { return step_total_s_; }
  std::int64_t steps() const { return steps_; }
  Timeline* timeline() const { return timeline_.get(); }

 private:
  std::shared_ptr<Timeline> timeline_;
  std::vector<std::pair<const char*, double>> phases_;
  double step_start_us_ = -1;
  std::shared_ptr<comm::DeviceMark> step_device_start_;
  double step_total_s_ = 0;
  std::int64_t steps_ = 0;
  StepTimes work_;
};

}  // namespace cohort::trace
