#include "cohort/trace/world_timeline.h"

#include <iostream>
#include <utility>

#include "cohort/errors.h"
#include "cohort/trace/clock_align.h"
#include "cohort/trace/device_clock.h"
#include "cohort/util/parse.h"

namespace cohort::trace {

TimelineOptions timeline_options_from_env(const comm::EnvMap& env) {
  auto get = [&](const char* name) -> const std::string* {
    auto it = env.find(name);
    return it == env.end() || it->second.empty() ? nullptr : &it->second;
  };
  TimelineOptions t;
  const auto* dir = get("COHORT_TIMELINE_DIR");
  if (!dir) return t;
  t.directory(*dir);
  if (auto steps = get("COHORT_TIMELINE_STEPS")) t.steps_from_string(*steps, "COHORT_TIMELINE_STEPS");
  if (auto cap = get("COHORT_TIMELINE_MAX_EVENTS")) {
    const long n = util::parse_long(*cap, "COHORT_TIMELINE_MAX_EVENTS");
    if (n <= 0) throw ConfigError("COHORT_TIMELINE_MAX_EVENTS: '" + *cap + "' must be a positive count of events");
    t.max_events(static_cast<std::size_t>(n));
  }
  if (auto device = get("COHORT_TIMELINE_DEVICE_EVENTS")) {
    if (*device != "0" && *device != "1")
      throw ConfigError("COHORT_TIMELINE_DEVICE_EVENTS: '" + *device +
                        "' must be 1 (a GPU's times on a track of its own, the default) or 0 (the host's only)");
    t.device_events(*device == "1");
  }
  return t;
}

comm::RecorderFactory timeline_recorder(TimelineOptions options) {
  return [options = std::move(options)](comm::Group& world_group, int rank,
                                        c10::Device device) -> std::shared_ptr<comm::Recorder> {
    auto timeline = std::make_shared<Timeline>(rank, options);
    timeline->set_clock_offset_us(measure_clock_offset_us(world_group, device));
    if (options.device_events() && !device.is_cpu()) {
      try {
        timeline->set_device_clock(event_clock(device, options.device_wait()));
      } catch (const std::exception& e) {
        // The host's times are still worth having: say why the device's are missing.
        std::cerr << "cohort: rank " << rank << ": the timeline keeps the host's times only: " << e.what()
                  << std::endl;
      }
    }
    return timeline;
  };
}

comm::InitOptions traced(comm::InitOptions options, const TimelineOptions& timeline) {
  if (timeline.enabled()) options.recorder(timeline_recorder(timeline));
  return options;
}

comm::InitOptions traced(const comm::EnvMap& env) {
  return traced(comm::InitOptions::from_env(env), timeline_options_from_env(env));
}

std::shared_ptr<Timeline> timeline_of(const comm::World& world) {
  return std::dynamic_pointer_cast<Timeline>(world.recorder());
}

}  // namespace cohort::trace
