// The device clock of timed c10::Events (Note [Device time on the host's clock] in
// device_clock.h). The only code of the timeline that runs on a GPU: kept to
// recording, querying and timing events.
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <mutex>
#include <thread>

#include "cohort/compat/event.h"
#include "cohort/errors.h"
#include "cohort/trace/device_clock.h"

namespace cohort::trace {
namespace {

struct Anchor {
  explicit Anchor(c10::Event e) : event(std::move(e)) {}
  c10::Event event;
  double host_us = 0;
};

class EventMark final : public comm::DeviceMark {
 public:
  EventMark(std::shared_ptr<const Anchor> anchor, c10::Event event)
      : anchor_(std::move(anchor)), event_(std::move(event)) {}

  std::optional<double> reached_us() override {
    if (!event_.query()) return std::nullopt;
    return anchor_->host_us + compat::elapsed_ms(anchor_->event, event_) * 1000.0;
  }

 private:
  std::shared_ptr<const Anchor> anchor_;  // recorded before this mark on the same device
  c10::Event event_;
};

class EventClock final : public DeviceClock {
 public:
  // Note [The clock's own stream]: the side stream of mark_after is taken once, from
  // the high-priority pool. ProcessGroupNCCL takes its streams from the low-priority
  // one, round robin; a side stream that was one of them would queue the end mark
  // behind that group's later collectives, and its wait into that group's work.
  explicit EventClock(c10::Device device)
      : device_(device),
        guard_(device.type()),
        side_(guard_.getStreamFromGlobalPool(device, /*isHighPriority=*/true)) {}

  c10::Device device() const override { return device_; }

  std::shared_ptr<comm::DeviceMark> mark() override {
    c10::Event event(device_.type(), compat::kTimedEvent);
    std::shared_ptr<const Anchor> anchor;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      anchor = anchor_;
    }
    event.record(guard_.getStream(device_));
    return std::make_shared<EventMark>(std::move(anchor), std::move(event));
  }

  std::shared_ptr<comm::DeviceMark> mark_after(const std::function<void()>& wait) override {
    c10::StreamGuard side(side_);
    wait();
    return mark();
  }

  void anchor(std::chrono::milliseconds bound) override {
    const double deadline = comm::steady_now_us() + static_cast<double>(bound.count()) * 1000.0;
    std::shared_ptr<Anchor> best;
    double best_width = 0;
    // The first anchor may wait for the stream's queued work; once the stream is idle
    // the next ones are reached at once. A thread descheduled between two polls
    // widens the interval the anchor was reached in: up to 5 tries for a narrow one.
    for (int attempt = 0; attempt < 5; ++attempt) {
      auto anchor = std::make_shared<Anchor>(c10::Event(device_.type(), compat::kTimedEvent));
      double pending_at = comm::steady_now_us();
      anchor->event.record(guard_.getStream(device_));
      for (;;) {
        const double asked = comm::steady_now_us();
        if (anchor->event.query()) {
          const double reached_by = comm::steady_now_us();
          anchor->host_us = (pending_at + reached_by) / 2;
          if (!best || reached_by - pending_at < best_width) {
            best = anchor;
            best_width = reached_by - pending_at;
          }
          break;
        }
        if (asked > deadline) {
          if (best) break;
          throw TimeoutError(fmt::format("cohort: the timeline waited {} ms for {}'s stream to run what was queued "
                                         "on it, to tie the device's times to the host's; the device is busy or "
                                         "hung. Start the timeline's window (--timeline-steps) at a step the "
                                         "device can reach, or set COHORT_TIMELINE_DEVICE_EVENTS=0",
                                         bound.count(), device_.str()),
                             "timeline device anchor", {});
        }
        pending_at = asked;
        std::this_thread::yield();
      }
      if (best_width <= 20 || comm::steady_now_us() > deadline) break;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    anchor_ = std::move(best);
  }

 private:
  c10::Device device_;
  c10::impl::VirtualGuardImpl guard_;
  c10::Stream side_;
  std::mutex mutex_;
  std::shared_ptr<const Anchor> anchor_;
};

}  // namespace

std::shared_ptr<DeviceClock> event_clock(c10::Device device, std::chrono::milliseconds anchor_bound) {
  if (device.is_cpu()) throw Error("the CPU runs what it is given as it is called: its times are the host's");
  if (!compat::kEventsAreTimed)
    throw Error("LibTorch before 2.4 cannot time device events (its c10::Event has no elapsedTime); build "
                "against LibTorch 2.4 or newer for the device's side of the timeline");
  try {
    auto clock = std::make_shared<EventClock>(device);
    clock->anchor(anchor_bound);
    return clock;
  } catch (const cohort::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(fmt::format("{} cannot record timed events: {}", device.str(), e.what()));
  }
}

}  // namespace cohort::trace
