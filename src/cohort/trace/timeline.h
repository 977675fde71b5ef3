#pragma once
// A per-rank timeline of what a training step spends its time on, written as a
// Chrome trace-event JSON file that Perfetto (ui.perfetto.dev) and chrome://tracing
// load. `cohort run --timeline DIR` asks every worker for one; a worker whose world
// is made with trace::traced() (world_timeline.h) keeps it. The world aligns the
// ranks' clocks at a barrier and hands the timeline to its groups and to DDP as their
// comm::Recorder, so collectives and DDP buckets appear without more code; a
// training loop adds its own phases with Span:
//
//   auto world = cohort::comm::World::init(cohort::trace::traced());
//   auto timeline = cohort::trace::timeline_of(world);  // null when off: every call is a no-op
//   for (...) {
//     cohort::trace::step(timeline.get(), step);
//     cohort::trace::Span s(timeline.get(), "step");
//     { cohort::trace::Span f(timeline.get(), "forward"); ... }
//   }
//
// `cohort trace merge DIR OUT.json` puts the ranks into one file, one process per rank.
//
// On a GPU the world also gives the timeline a device clock (trace/device_clock.h):
// each Span and each collective on the device's tensors is drawn a second time on a
// track of the device's own, where the device ran it (Note [Device time on the
// host's clock]).
#include <torch/arg.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cohort/comm/recorder.h"

namespace cohort::trace {

class DeviceClock;

struct TimelineOptions {
  // The directory the file goes to: DIR/rank-<rank>.json.
  TORCH_ARG(std::string, directory) = "";
  // Only steps first_step..last_step (inclusive) are recorded; last_step < 0 means no
  // end. Events before the first step() call belong to step 0.
  TORCH_ARG(std::int64_t, first_step) = 0;
  TORCH_ARG(std::int64_t, last_step) = -1;
  // A cap on the events kept; later ones are counted as dropped and reported.
  TORCH_ARG(std::size_t, max_events) = 200000;
  // Whether a world on a GPU gives its timeline a device clock (COHORT_TIMELINE_DEVICE_EVENTS).
  TORCH_ARG(bool, device_events) = true;
  // How long write() waits for the device to reach the marks still pending (events
  // it has not, say because the run stopped mid-step, are counted and left out), and
  // how long taking an anchor may wait for the stream.
  TORCH_ARG(std::chrono::milliseconds, device_wait) = std::chrono::seconds(10);
  // A new anchor at the first step boundary after this long (the device's elapsed
  // times are floats: Note [Device time on the host's clock]).
  TORCH_ARG(std::chrono::milliseconds, device_anchor_every) = std::chrono::seconds(60);

 public:
  bool enabled() const { return !directory_.empty(); }
  // Parses "A:B", "A:" or "A" (a single step) for --timeline-steps; throws
  // ConfigError naming `what` on anything else.
  TimelineOptions& steps_from_string(const std::string& text, const std::string& what);
};

// One event, in microseconds on this process's steady clock.
struct Event {
  enum class Kind : char { kSpan = 'X', kInstant = 'i', kAsyncBegin = 'b', kAsyncEnd = 'e' };
  Kind kind = Kind::kSpan;
  std::string name;
  const char* category = "";
  double ts_us = 0;
  double dur_us = 0;       // spans only
  std::uint64_t id = 0;    // async pairs only
  int tid = 0;
  std::int64_t bytes = -1; // shown as args.bytes when >= 0
  std::int64_t step = 0;
};

// The thread id of the device's track in the written file.
inline constexpr int kDeviceTrack = 1000;

class Timeline final : public comm::Recorder {
 public:
  Timeline(int rank, TimelineOptions options);
  // Writes the file if write() was not called; a failure is printed, not thrown.
  ~Timeline() override;
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  static double now_us() { return comm::steady_now_us(); }
  int rank() const { return rank_; }
  const TimelineOptions& options() const { return options_; }

  // The step that the following events belong to.
  void set_step(std::int64_t step);
  std::int64_t step() const { return step_.load(std::memory_order_relaxed); }
  // Whether the current step is inside the window (cheap; call before building a name).
  bool recording() const override { return recording_.load(std::memory_order_relaxed); }

  void span(std::string name, const char* category, double start_us, double end_us, std::int64_t bytes = -1) override;
  void instant(std::string name, const char* category, double at_us, std::int64_t bytes = -1) override;
  // An operation that may overlap others on its thread (a collective in flight, a DDP
  // bucket): drawn on a track of its own, so per-thread spans stay well nested.
  void async(std::string name, const char* category, double start_us, double end_us, std::int64_t bytes = -1) override;

  // Added to every timestamp written: rank 0's clock minus this one's (Note [Aligned clocks]).
  void set_clock_offset_us(double offset) { offset_us_ = offset; }
  double clock_offset_us() const { return offset_us_; }

  // The device's side (Note [Device time on the host's clock]). With a clock, Span
  // and the groups' collectives on the clock's device also record marks, drawn on
  // the device's track once the device has reached them.
  void set_device_clock(std::shared_ptr<DeviceClock> clock);
  const DeviceClock* device_clock() const { return device_clock_.get(); }
  // A mark on the clock's device while recording; null without a clock.
  std::shared_ptr<comm::DeviceMark> device_mark();
  std::shared_ptr<comm::DeviceMark> device_mark(c10::Device device) override;
  std::shared_ptr<comm::DeviceMark> device_mark_after(c10::Device device,
                                                      const std::function<void()>& wait_again) override;
  // A phase on the device's track; kept until the device reaches both marks (a null
  // mark: nothing is kept).
  void device_span(std::string name, const char* category, std::shared_ptr<comm::DeviceMark> start,
                   std::shared_ptr<comm::DeviceMark> end, std::int64_t bytes = -1);
  void device_async(std::string name, const char* category, std::shared_ptr<comm::DeviceMark> start,
                    std::shared_ptr<comm::DeviceMark> end, std::int64_t bytes = -1) override;
  // Moves what the device has reached onto the timeline (set_step does, as does
  // write(), which first waits up to device_wait for the rest). Returns how many
  // device events are still pending.
  std::size_t collect_device_events();
  // Device events that write() gave up on: the device had not reached their marks.
  std::size_t device_unfinished() const { return device_unfinished_.load(std::memory_order_relaxed); }

  std::size_t size() const;
  std::size_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  // Time spent inside this class's record calls, so the cost of tracing is reported.
  double overhead_us() const;

  // DIR/rank-<rank>.json. Creates the directory. Throws cohort::Error on failure.
  std::string path() const;
  void write();

 private:
  int thread_id();
  void add(Event e, double entered_us);
  void keep_device_event(Event e, std::shared_ptr<comm::DeviceMark> start, std::shared_ptr<comm::DeviceMark> end);
  void anchor_device_clock();
  void wait_for_device_events();
  std::shared_ptr<comm::DeviceMark> guarded_mark(const std::function<std::shared_ptr<comm::DeviceMark>()>& make);

  struct DeviceEvent {
    Event event;  // kind, name, category, bytes and step; times from the marks
    std::shared_ptr<comm::DeviceMark> start, end;
  };

  int rank_;
  TimelineOptions options_;
  std::atomic<std::int64_t> step_{0};
  std::atomic<bool> recording_{true};
  std::atomic<std::size_t> dropped_{0};
  std::atomic<std::uint64_t> next_async_id_{1};
  double offset_us_ = 0;
  bool written_ = false;
  mutable std::mutex mutex_;
  std::vector<Event> events_;
  std::unordered_map<std::thread::id, int> threads_;
  double overhead_us_ = 0;
  std::shared_ptr<DeviceClock> device_clock_;
  std::vector<DeviceEvent> device_pending_;  // under mutex_
  std::size_t device_pending_places_ = 0;    // under mutex_: the events they will make (an async makes 2)
  std::mutex collect_mutex_;                 // one collector at a time; the device is asked outside mutex_
  double device_anchored_us_ = 0;            // when the clock last took an anchor
  std::atomic<std::size_t> device_unfinished_{0};
};

// Marks the start of `step` (nullptr: no-op).
inline void step(Timeline* timeline, std::int64_t n) {
  if (timeline) timeline->set_step(n);
}

// A phase on the calling thread, from construction to destruction. With a null
// timeline it reads no clock.
class Span {
 public:
  Span(Timeline* timeline, const char* name, const char* category = "phase")
      : timeline_(timeline && timeline->recording() ? timeline : nullptr), name_(name), category_(category),
        start_us_(timeline_ ? Timeline::now_us() : 0), device_start_(timeline_ ? timeline_->device_mark() : nullptr) {}
  ~Span() {
    if (!timeline_) return;
    auto device_end = device_start_ ? timeline_->device_mark() : nullptr;
    timeline_->span(name_, category_, start_us_, Timeline::now_us());
    if (device_start_) timeline_->device_span(name_, category_, std::move(device_start_), std::move(device_end));
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  Timeline* timeline_;
  const char* name_;
  const char* category_;
  double start_us_;
  std::shared_ptr<comm::DeviceMark> device_start_;
};

}  // namespace cohort::trace
