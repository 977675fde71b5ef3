#pragma once
// A world that records on a per-rank Timeline. comm knows only its Recorder
// interface (comm/recorder.h); this is where a timeline is made and put in:
//
//   auto world = cohort::comm::World::init(cohort::trace::traced());  // the launcher's env
//   auto timeline = cohort::trace::timeline_of(world);                 // null when off
//
// or, outside the launcher, traced(InitOptions(), TimelineOptions().directory("trace")).
#include <memory>

#include "cohort/comm/environment.h"
#include "cohort/comm/options.h"
#include "cohort/comm/world.h"
#include "cohort/trace/timeline.h"

namespace cohort::trace {

// COHORT_TIMELINE_DIR, COHORT_TIMELINE_STEPS (FIRST:LAST) and
// COHORT_TIMELINE_MAX_EVENTS, which `cohort run --timeline` sets, and
// COHORT_TIMELINE_DEVICE_EVENTS (1 or 0), which a user may; disabled when the
// directory is unset. Throws ConfigError naming the variable on a bad value.
TimelineOptions timeline_options_from_env(const comm::EnvMap& env);

// Makes each rank's Timeline once the world's group exists, its clock aligned to
// rank 0's at a barrier (Note [Aligned clocks]), with a device clock when the
// world's device is a GPU (Note [Device time on the host's clock]).
comm::RecorderFactory timeline_recorder(TimelineOptions options);

// `options`, recording on a timeline when `timeline` is enabled (else unchanged).
comm::InitOptions traced(comm::InitOptions options, const TimelineOptions& timeline);
// The launcher's settings: InitOptions::from_env(env), with the timeline that
// `cohort run --timeline` asks for.
comm::InitOptions traced(const comm::EnvMap& env = comm::process_environment());

// The world's recorder as a Timeline; null when it has none (or another kind).
std::shared_ptr<Timeline> timeline_of(const comm::World& world);

}  // namespace cohort::trace
