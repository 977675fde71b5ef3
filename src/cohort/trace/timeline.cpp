#include "cohort/trace/timeline.h"

#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <optional>

#include "cohort/errors.h"
#include "cohort/trace/chrome_trace.h"
#include "cohort/trace/device_clock.h"
#include "cohort/util/parse.h"

namespace cohort::trace {

TimelineOptions& TimelineOptions::steps_from_string(const std::string& text, const std::string& what) {
  const auto colon = text.find(':');
  auto number = [&](const std::string& part) {
    const long v = util::parse_long(part, what);
    if (v < 0) throw ConfigError(fmt::format("{}: '{}' has a negative step; give FIRST:LAST, e.g. 20:40", what, text));
    return static_cast<std::int64_t>(v);
  };
  if (text.empty()) throw ConfigError(fmt::format("{}: empty; give FIRST:LAST, FIRST: or one step", what));
  if (colon == std::string::npos) {
    first_step_ = last_step_ = number(text);
  } else {
    first_step_ = number(text.substr(0, colon));
    const std::string last = text.substr(colon + 1);
    last_step_ = last.empty() ? -1 : number(last);
    if (last_step_ >= 0 && last_step_ < first_step_)
      throw ConfigError(fmt::format("{}: '{}' ends before it starts; give FIRST:LAST with FIRST <= LAST", what, text));
  }
  return *this;
}

Timeline::Timeline(int rank, TimelineOptions options) : rank_(rank), options_(std::move(options)) {
  events_.reserve(std::min<std::size_t>(options_.max_events(), 4096));
  set_step(0);
}

Timeline::~Timeline() {
  if (written_) return;
  try {
    write();
  } catch (const std::exception& e) {
    std::cerr << "cohort: rank " << rank_ << ": the timeline was not written: " << e.what() << std::endl;
  }
}

void Timeline::set_step(std::int64_t step) {
  step_.store(step, std::memory_order_relaxed);
  const bool in = step >= options_.first_step() && (options_.last_step() < 0 || step <= options_.last_step());
  const bool was = recording_.exchange(in, std::memory_order_relaxed);
  if (!device_clock_) return;
  // Note [Device time on the host's clock]: a fresh anchor where the window opens,
  // and at a step boundary once the last one is old.
  const double age_us = now_us() - device_anchored_us_;
  if (in && (!was || age_us > static_cast<double>(options_.device_anchor_every().count()) * 1000.0))
    anchor_device_clock();
  collect_device_events();
}

void Timeline::anchor_device_clock() {
  try {
    device_clock_->anchor(options_.device_wait());
  } catch (const std::exception& e) {
    std::cerr << "cohort: rank " << rank_ << ": the timeline keeps its older anchor: " << e.what() << std::endl;
  }
  device_anchored_us_ = now_us();  // after a failure too: the next try is an interval away
}

int Timeline::thread_id() {
  // Called with mutex_ held. Small numbers read better in the viewer than thread ids.
  auto [it, inserted] = threads_.emplace(std::this_thread::get_id(), static_cast<int>(threads_.size()));
  return it->second;
}

void Timeline::add(Event e, double entered_us) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (events_.size() + device_pending_places_ >= options_.max_events()) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
  } else {
    e.tid = thread_id();
    e.step = step();
    events_.push_back(std::move(e));
  }
  overhead_us_ += now_us() - entered_us;
}

namespace {
Event make_event(Event::Kind kind, std::string name, const char* category, double ts_us, std::int64_t bytes) {
  Event e;
  e.kind = kind;
  e.name = std::move(name);
  e.category = category;
  e.ts_us = ts_us;
  e.bytes = bytes;
  return e;
}
}  // namespace

void Timeline::span(std::string name, const char* category, double start_us, double end_us, std::int64_t bytes) {
  if (!recording()) return;
  const double entered = now_us();
  Event e = make_event(Event::Kind::kSpan, std::move(name), category, start_us, bytes);
  e.dur_us = std::max(0.0, end_us - start_us);
  add(std::move(e), entered);
}

void Timeline::instant(std::string name, const char* category, double at_us, std::int64_t bytes) {
  if (!recording()) return;
  const double entered = now_us();
  add(make_event(Event::Kind::kInstant, std::move(name), category, at_us, bytes), entered);
}

void Timeline::async(std::string name, const char* category, double start_us, double end_us, std::int64_t bytes) {
  if (!recording()) return;
  const double entered = now_us();
  Event begin = make_event(Event::Kind::kAsyncBegin, std::move(name), category, start_us, bytes);
  begin.id = next_async_id_.fetch_add(1, std::memory_order_relaxed);
  Event end = begin;
  end.kind = Event::Kind::kAsyncEnd;
  end.ts_us = std::max(start_us, end_us);
  end.bytes = -1;
  // Both or neither: at the cap, a begin without its end would be an open event.
  std::lock_guard<std::mutex> lock(mutex_);
  if (events_.size() + device_pending_places_ + 2 > options_.max_events()) {
    dropped_.fetch_add(2, std::memory_order_relaxed);
  } else {
    for (Event* e : {&begin, &end}) {
      e->tid = thread_id();
      e->step = step();
      events_.push_back(std::move(*e));
    }
  }
  overhead_us_ += now_us() - entered;
}

// ---- the device's track -----------------------------------------------------

void Timeline::set_device_clock(std::shared_ptr<DeviceClock> clock) {
  device_clock_ = std::move(clock);
  device_anchored_us_ = now_us();  // a clock comes anchored (event_clock)
}

std::shared_ptr<comm::DeviceMark> Timeline::guarded_mark(
    const std::function<std::shared_ptr<comm::DeviceMark>()>& make) {
  const double entered = now_us();
  std::shared_ptr<comm::DeviceMark> mark;
  try {
    mark = make();
  } catch (const std::exception&) {
    // A device in error (a sticky CUDA error): no mark, so no device event; never an
    // exception out of a Span's destructor or a collective's wait.
    device_unfinished_.fetch_add(1, std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  overhead_us_ += now_us() - entered;
  return mark;
}

std::shared_ptr<comm::DeviceMark> Timeline::device_mark() {
  if (!device_clock_ || !recording()) return nullptr;
  return guarded_mark([&] { return device_clock_->mark(); });
}

std::shared_ptr<comm::DeviceMark> Timeline::device_mark(c10::Device device) {
  if (!device_clock_ || device != device_clock_->device()) return nullptr;
  return device_mark();
}

std::shared_ptr<comm::DeviceMark> Timeline::device_mark_after(c10::Device device,
                                                              const std::function<void()>& wait_again) {
  if (!device_clock_ || device != device_clock_->device() || !recording()) return nullptr;
  return guarded_mark([&] { return device_clock_->mark_after(wait_again); });
}

void Timeline::device_span(std::string name, const char* category, std::shared_ptr<comm::DeviceMark> start,
                           std::shared_ptr<comm::DeviceMark> end, std::int64_t bytes) {
  if (!recording() || !start || !end) return;
  keep_device_event(make_event(Event::Kind::kSpan, std::move(name), category, 0, bytes), std::move(start),
                    std::move(end));
}

void Timeline::device_async(std::string name, const char* category, std::shared_ptr<comm::DeviceMark> start,
                            std::shared_ptr<comm::DeviceMark> end, std::int64_t bytes) {
  if (!recording() || !start || !end) return;
  // Its own name: the viewers put async events of one name on one track, whatever
  // their thread, and the host's event of the same collective is there.
  if (device_clock_) name += " on " + device_clock_->device().str();
  keep_device_event(make_event(Event::Kind::kAsyncBegin, std::move(name), category, 0, bytes), std::move(start),
                    std::move(end));
}

namespace {
std::size_t places_of(const Event& e) { return e.kind == Event::Kind::kSpan ? 1 : 2; }
}  // namespace

void Timeline::keep_device_event(Event e, std::shared_ptr<comm::DeviceMark> start,
                                 std::shared_ptr<comm::DeviceMark> end) {
  const double entered = now_us();
  e.tid = kDeviceTrack;
  e.step = step();  // the step it was recorded in, not the one it is collected in
  const std::size_t places = places_of(e);
  bool collect = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Past the cap it is dropped now, as the host's events are when they come.
    if (events_.size() + device_pending_places_ + places > options_.max_events()) {
      dropped_.fetch_add(places, std::memory_order_relaxed);
    } else {
      device_pending_places_ += places;
      device_pending_.push_back({std::move(e), std::move(start), std::move(end)});
      // A loop that never calls set_step still has its events collected.
      collect = device_pending_.size() % 1024 == 0;
    }
    overhead_us_ += now_us() - entered;
  }
  if (collect) collect_device_events();
}

std::size_t Timeline::collect_device_events() {
  // The device is asked outside mutex_, so that threads recording host events do
  // not wait for it; collect_mutex_ keeps the pending events in order meanwhile.
  std::lock_guard<std::mutex> collecting(collect_mutex_);
  const double entered = now_us();
  std::vector<DeviceEvent> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending.swap(device_pending_);
  }
  std::vector<DeviceEvent> still;
  std::vector<Event> done;
  std::size_t failed = 0;
  for (auto& d : pending) {
    std::optional<double> start, end;
    try {
      start = d.start->reached_us();
      if (start) end = d.end->reached_us();
    } catch (const std::exception&) {
      ++failed;  // the device failed (a CUDA error): its marks will never be reached
      continue;
    }
    if (!end) {
      still.push_back(std::move(d));
      continue;
    }
    Event e = std::move(d.event);
    e.ts_us = *start;
    if (e.kind == Event::Kind::kSpan) {
      e.dur_us = std::max(0.0, *end - *start);
      done.push_back(std::move(e));
    } else {
      e.id = next_async_id_.fetch_add(1, std::memory_order_relaxed);
      Event finish = e;
      finish.kind = Event::Kind::kAsyncEnd;
      finish.ts_us = std::max(*start, *end);
      finish.bytes = -1;
      done.push_back(std::move(e));
      done.push_back(std::move(finish));
    }
  }
  device_unfinished_.fetch_add(failed, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mutex_);
  // Their places were held while pending: the cap was applied when they came.
  for (auto& e : done) events_.push_back(std::move(e));
  still.insert(still.end(), std::make_move_iterator(device_pending_.begin()),
               std::make_move_iterator(device_pending_.end()));
  device_pending_ = std::move(still);
  device_pending_places_ = 0;
  for (const auto& d : device_pending_) device_pending_places_ += places_of(d.event);
  overhead_us_ += now_us() - entered;
  return device_pending_.size();
}

void Timeline::wait_for_device_events() {
  const auto deadline = std::chrono::steady_clock::now() + options_.device_wait();
  std::size_t left = collect_device_events();
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    left = collect_device_events();
  }
  if (left > 0) {
    // What is pending now, counted as it is cleared: a collector cannot be between
    // its swap and its merge, and events kept since the last collect count too.
    std::lock_guard<std::mutex> collecting(collect_mutex_);
    std::lock_guard<std::mutex> lock(mutex_);
    left = device_pending_.size();
    device_pending_.clear();
    device_pending_places_ = 0;
  }
  device_unfinished_.fetch_add(left, std::memory_order_relaxed);
  const std::size_t unfinished = device_unfinished();
  if (unfinished == 0) return;
  std::cerr << fmt::format("cohort: rank {}: {} device event(s) of the timeline were left out: {} of them had not "
                           "been reached after {} ms, the others failed to record or to be read (a device error). "
                           "Write the timeline once the device has finished (after torch::cuda::synchronize()), or "
                           "raise TimelineOptions::device_wait\n",
                           rank_, unfinished, left, options_.device_wait().count());
}

std::size_t Timeline::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

double Timeline::overhead_us() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return overhead_us_;
}

std::string Timeline::path() const {
  return (std::filesystem::path(options_.directory()) / fmt::format("rank-{}.json", rank_)).string();
}

void Timeline::write() {
  written_ = true;
  wait_for_device_events();
  std::vector<Event> events;
  std::size_t threads = 0;
  double overhead = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events = events_;
    threads = threads_.size();
    overhead = overhead_us_;
  }
  std::error_code ec;
  std::filesystem::create_directories(options_.directory(), ec);
  if (ec) {
    throw Error(fmt::format("timeline directory {}: {}; give a writable --timeline directory", options_.directory(),
                            ec.message()));
  }
  TraceFileInfo info{rank_, offset_us_, dropped(), overhead, threads};
  if (device_clock_) info.device = device_clock_->device().str();
  info.device_unfinished = device_unfinished();
  write_chrome_trace(path(), events, info);
}

}  // namespace cohort::trace
