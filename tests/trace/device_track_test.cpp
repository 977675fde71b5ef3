// The timeline's device track (Note [Device time on the host's clock]) with a device
// clock whose marks the test reaches by hand: what a GPU's events would report,
// without a GPU. The CUDA events themselves are tested in gpu/strategies_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "cohort/trace/device_clock.h"
#include "cohort/trace/step_profiler.h"
#include "cohort/trace/timeline.h"
#include "cohort/trace/world_timeline.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace {

using cohort::trace::kDeviceTrack;
using cohort::trace::Timeline;
using cohort::trace::TimelineOptions;
using nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

class HandMark final : public cohort::comm::DeviceMark {
 public:
  std::optional<double> reached_us() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fail_) throw std::runtime_error("CUDA error: an illegal memory access was encountered");
    return at_;
  }
  void reach(double us) {
    std::lock_guard<std::mutex> lock(mutex_);
    at_ = us;
  }
  void fail() {
    std::lock_guard<std::mutex> lock(mutex_);
    fail_ = true;
  }

 private:
  std::mutex mutex_;
  std::optional<double> at_;
  bool fail_ = false;
};

// Marks on "the CPU", so that a thread world's collectives are marked too. With
// `lag_us` set, every mark is reached at once, that long after the host made it.
class HandClock final : public cohort::trace::DeviceClock {
 public:
  explicit HandClock(std::optional<double> lag_us = std::nullopt) : lag_us_(lag_us) {}
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  std::shared_ptr<cohort::comm::DeviceMark> mark_after(const std::function<void()>& wait) override {
    wait();
    after_calls_.fetch_add(1);
    return mark();
  }
  int after_calls() const { return after_calls_.load(); }
  std::shared_ptr<cohort::comm::DeviceMark> mark() override {
    if (broken_) throw std::runtime_error("CUDA error: an illegal memory access was encountered");
    auto m = std::make_shared<HandMark>();
    if (lag_us_) m->reach(Timeline::now_us() + *lag_us_);
    std::lock_guard<std::mutex> lock(mutex_);
    marks_.push_back(m);
    return m;
  }
  void anchor(std::chrono::milliseconds) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++anchors_;
    if (busy_) throw cohort::TimeoutError("the hand clock's device is busy", "anchor", {});
  }
  std::shared_ptr<HandMark> mark_at(std::size_t i) {
    std::lock_guard<std::mutex> lock(mutex_);
    return marks_.at(i);
  }
  std::size_t marks() {
    std::lock_guard<std::mutex> lock(mutex_);
    return marks_.size();
  }
  int anchors() {
    std::lock_guard<std::mutex> lock(mutex_);
    return anchors_;
  }
  void set_busy() { busy_ = true; }
  void set_broken() { broken_ = true; }

 private:
  std::optional<double> lag_us_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<HandMark>> marks_;
  int anchors_ = 0;
  bool busy_ = false;
  std::atomic<bool> broken_{false};
  std::atomic<int> after_calls_{0};
};

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

std::vector<json> on_track(const json& doc, int tid) {
  std::vector<json> out;
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") != "M" && e.at("tid") == tid) out.push_back(e);
  return out;
}

TEST(DeviceTrack, ASpanIsDrawnWhereTheDeviceRanItInTheStepItWasRecordedIn) {
  cohort::testing::TempDir dir;
  auto clock = std::make_shared<HandClock>();
  Timeline t(2, TimelineOptions().directory(dir.path));
  t.set_clock_offset_us(1000);
  t.set_device_clock(clock);
  t.set_step(7);
  double host_start = Timeline::now_us();
  { cohort::trace::Span s(&t, "forward"); }
  ASSERT_EQ(clock->marks(), 2u);
  EXPECT_EQ(t.collect_device_events(), 1u) << "drawn before the device reached its marks";
  clock->mark_at(0)->reach(host_start + 500);
  EXPECT_EQ(t.collect_device_events(), 1u) << "drawn with only its start reached";
  clock->mark_at(1)->reach(host_start + 900);
  t.set_step(8);  // collects
  EXPECT_EQ(t.collect_device_events(), 0u);
  t.write();

  const auto doc = read_json(t.path());
  const auto host = on_track(doc, 0);
  const auto device = on_track(doc, kDeviceTrack);
  ASSERT_EQ(host.size(), 1u);
  ASSERT_EQ(device.size(), 1u);
  EXPECT_EQ(device[0].at("name"), "forward");
  EXPECT_EQ(device[0].at("ph"), "X");
  EXPECT_DOUBLE_EQ(device[0].at("ts").get<double>(), host_start + 500 + 1000);  // with the clock offset
  EXPECT_DOUBLE_EQ(device[0].at("dur").get<double>(), 400);
  EXPECT_EQ(device[0].at("args").at("step"), 7) << "the step it was recorded in, not the one it was collected in";
  bool named = false;
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name" && e.at("tid") == kDeviceTrack)
      named = e.at("args").at("name") == "cpu (device time)";
  EXPECT_TRUE(named) << "the device track is not named after its device";
  EXPECT_EQ(doc.at("otherData").at("device"), "cpu");
  EXPECT_EQ(doc.at("otherData").at("device_events_unfinished"), 0);
}

TEST(DeviceTrack, WithoutAClockOrOutsideTheWindowNothingIsMarked) {
  cohort::testing::TempDir dir;
  {
    Timeline t(0, TimelineOptions().directory(dir.path));
    EXPECT_EQ(t.device_mark(), nullptr);
    { cohort::trace::Span s(&t, "forward"); }
    t.write();
    const auto doc = read_json(t.path());
    EXPECT_TRUE(on_track(doc, kDeviceTrack).empty());
    EXPECT_TRUE(doc.at("otherData").at("device").is_null());
  }
  auto clock = std::make_shared<HandClock>(0.0);
  Timeline t(0, TimelineOptions().directory(dir.path).first_step(3).last_step(3));
  t.set_device_clock(clock);
  EXPECT_EQ(t.device_mark(c10::Device(c10::kCUDA, 0)), nullptr) << "a mark for another device than the clock's";
  for (int step = 1; step <= 5; ++step) {
    t.set_step(step);
    cohort::trace::Span s(&t, "step");
  }
  EXPECT_EQ(clock->marks(), 2u) << "only step 3 is inside the window";
  EXPECT_EQ(clock->anchors(), 1) << "a fresh anchor where the window opens, and only there";
  t.write();
  const auto device = on_track(read_json(t.path()), kDeviceTrack);
  ASSERT_EQ(device.size(), 1u);
  EXPECT_EQ(device[0].at("args").at("step"), 3);
}

TEST(DeviceTrack, AnAnchorThatTimesOutKeepsTheOldOneAndSaysSo) {
  cohort::testing::TempDir dir;
  auto clock = std::make_shared<HandClock>(0.0);
  clock->set_busy();
  Timeline t(4, TimelineOptions().directory(dir.path).first_step(2));
  t.set_device_clock(clock);
  t.set_step(1);
  testing::internal::CaptureStderr();
  t.set_step(2);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(clock->anchors(), 1);
  EXPECT_NE(said.find("rank 4"), std::string::npos) << said;
  EXPECT_NE(said.find("busy"), std::string::npos) << said;
  { cohort::trace::Span s(&t, "step"); }
  t.write();
  EXPECT_EQ(on_track(read_json(t.path()), kDeviceTrack).size(), 1u) << "the device track went on after the warning";
}

TEST(DeviceTrack, MarksTheDeviceNeverReachesAreCountedAndLeftOutAfterABoundedWait) {
  cohort::testing::TempDir dir;
  auto clock = std::make_shared<HandClock>();
  Timeline t(1, TimelineOptions().directory(dir.path).device_wait(100ms));
  t.set_device_clock(clock);
  { cohort::trace::Span s(&t, "forward"); }
  { cohort::trace::Span s(&t, "backward"); }
  { cohort::trace::Span s(&t, "optimizer"); }
  ASSERT_EQ(clock->marks(), 6u);
  clock->mark_at(0)->reach(Timeline::now_us());
  clock->mark_at(1)->reach(Timeline::now_us() + 10);  // forward: reached
  clock->mark_at(2)->reach(Timeline::now_us());       // backward: its end never is
  clock->mark_at(4)->fail();                          // optimizer: the device failed
  testing::internal::CaptureStderr();
  const auto started = std::chrono::steady_clock::now();
  t.write();
  const auto waited = std::chrono::steady_clock::now() - started;
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_GE(waited, 100ms);
  EXPECT_LT(waited, 5s) << "write() waited past its bound";
  EXPECT_EQ(t.device_unfinished(), 2u);
  EXPECT_NE(said.find("rank 1: 2 device event(s) of the timeline were left out: 1 of them had not been reached"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("device_wait"), std::string::npos) << said;
  const auto doc = read_json(t.path());
  EXPECT_EQ(doc.at("otherData").at("device_events_unfinished"), 2);
  const auto device = on_track(doc, kDeviceTrack);
  ASSERT_EQ(device.size(), 1u);
  EXPECT_EQ(device[0].at("name"), "forward");
  EXPECT_EQ(on_track(doc, 0).size(), 3u) << "the host's spans are all kept";
}

// The trainer's profiler draws its steps and phases on the device's track too.
TEST(DeviceTrack, TheProfilersStepsAndPhasesHaveDeviceTwins) {
  cohort::testing::TempDir dir;
  auto timeline = std::make_shared<Timeline>(0, TimelineOptions().directory(dir.path));
  timeline->set_device_clock(std::make_shared<HandClock>(40.0));
  cohort::trace::StepProfiler profiler(timeline);
  for (int step = 1; step <= 2; ++step) {
    profiler.begin_step(step);
    { auto p = profiler.phase("forward"); }
    { auto p = profiler.phase("backward"); }
    profiler.end_step();
  }
  timeline->write();
  const auto doc = read_json(timeline->path());
  std::multiset<std::string> host, device;
  for (const auto& e : on_track(doc, 0))
    host.insert(e.at("name").get<std::string>() + " " + std::to_string(e.at("args").at("step").get<int>()));
  for (const auto& e : on_track(doc, kDeviceTrack))
    device.insert(e.at("name").get<std::string>() + " " + std::to_string(e.at("args").at("step").get<int>()));
  EXPECT_EQ(host.size(), 6u);
  EXPECT_EQ(device, host);
}

// A device in error (a sticky CUDA error) gives no marks: never an exception out of
// a Span's destructor or out of a collective's wait, whose result is still there.
TEST(DeviceTrack, ADeviceThatFailsToMarkLosesItsEventsAndNothingElse) {
  cohort::testing::TempDir dir;
  auto clock = std::make_shared<HandClock>(0.0);
  Timeline t(0, TimelineOptions().directory(dir.path));
  t.set_device_clock(clock);
  clock->set_broken();
  EXPECT_NO_THROW({ cohort::trace::Span s(&t, "forward"); });
  EXPECT_EQ(t.device_mark_after(c10::Device(c10::kCPU), [] {}), nullptr);
  testing::internal::CaptureStderr();
  t.write();
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(t.device_unfinished(), 2u);
  EXPECT_NE(said.find("failed to record"), std::string::npos) << said;
  const auto doc = read_json(t.path());
  EXPECT_TRUE(on_track(doc, kDeviceTrack).empty());
  EXPECT_EQ(on_track(doc, 0).size(), 1u) << "the host's span is kept";
}

TEST(DeviceTrack, AnOldAnchorIsRenewedAtAStepBoundary) {
  cohort::testing::TempDir dir;
  auto clock = std::make_shared<HandClock>(0.0);
  Timeline t(0, TimelineOptions().directory(dir.path).device_anchor_every(std::chrono::milliseconds(0)));
  t.set_device_clock(clock);
  for (int step = 1; step <= 3; ++step) t.set_step(step);
  EXPECT_EQ(clock->anchors(), 3);
  Timeline hourly(1, TimelineOptions().directory(dir.path).device_anchor_every(std::chrono::hours(1)));
  auto other = std::make_shared<HandClock>(0.0);
  hourly.set_device_clock(other);
  for (int step = 1; step <= 3; ++step) hourly.set_step(step);
  EXPECT_EQ(other->anchors(), 0) << "the clock came anchored and the window was open from the start";
}

TEST(DeviceTrack, PendingEventsCountAgainstTheCap) {
  cohort::testing::TempDir dir;
  auto clock = std::make_shared<HandClock>(0.0);
  Timeline t(0, TimelineOptions().directory(dir.path).max_events(5));
  t.set_device_clock(clock);
  for (int i = 0; i < 4; ++i) {
    cohort::trace::Span s(&t, "phase");
  }
  t.write();
  // Each phase takes a host event and a device event: 5 places for 8.
  EXPECT_EQ(t.size(), 5u);
  EXPECT_EQ(t.dropped(), 3u);
}

// Ranks as threads: each rank's collectives on the clock's device get a device twin
// of their host event, from the stream reaching the launch to it having the result.
TEST(DeviceTrack, CollectivesOnTheClocksDeviceAreDrawnFromLaunchToResult) {
  cohort::testing::TempDir dir;
  torch::manual_seed(0);
  const auto x = torch::randn({8, 16});
  const auto y = torch::randn({8, 4});
  auto options = cohort::trace::traced(cohort::testing::quick_thread_world_options(),
                                       TimelineOptions().directory(dir.path));
  cohort::testing::run_thread_world(
      2,
      [&](cohort::comm::World& world) {
        auto timeline = cohort::trace::timeline_of(world);
        ASSERT_NE(timeline, nullptr);
        EXPECT_EQ(timeline->device_clock(), nullptr) << "a world on the CPU got a device clock";
        auto clock = std::make_shared<HandClock>(25.0);
        timeline->set_device_clock(clock);
        auto model = torch::nn::Linear(16, 4);
        cohort::ddp::DistributedDataParallel ddp(model, world.group());
        for (int step = 1; step <= 2; ++step) {
          cohort::trace::step(timeline.get(), step);
          torch::mse_loss(ddp(x), y).backward();
        }
        auto t = torch::ones({3});
        world.group().all_reduce(t);
        timeline->write();
        // Every collective's end came from mark_after (after the backend's wait), none
        // from a plain mark on the caller's stream.
        std::size_t device_collectives = 0;
        for (const auto& e : on_track(read_json(timeline->path()), kDeviceTrack))
          device_collectives += e.at("ph") == "b";
        EXPECT_EQ(clock->after_calls(), static_cast<int>(device_collectives));
        EXPECT_GT(device_collectives, 0u);
      },
      options);
  for (int rank = 0; rank < 2; ++rank) {
    const auto doc = read_json(fs::path(dir.path) / ("rank-" + std::to_string(rank) + ".json"));
    // "name step bytes" of every collective, on the host's tracks and on the device's.
    std::multiset<std::string> host, device;
    for (const auto& e : doc.at("traceEvents")) {
      if (e.at("ph") == "M" || e.at("cat") != "collective") continue;
      const auto ph = e.at("ph").get<std::string>();
      if (ph == "e") continue;
      ASSERT_EQ(ph, "b") << e.dump();
      const bool on_device = e.at("tid") == kDeviceTrack;
      std::string name = e.at("name").get<std::string>();
      const std::string suffix = " on cpu";  // the device twin's own name, for the viewers' async tracks
      if (on_device) {
        ASSERT_GT(name.size(), suffix.size()) << e.dump();
        ASSERT_EQ(name.substr(name.size() - suffix.size()), suffix) << e.dump();
        name.resize(name.size() - suffix.size());
      }
      std::ostringstream key;
      key << name << " " << e.at("args").at("step") << " " << e.at("args").value("bytes", -1);
      (on_device ? device : host).insert(key.str());
    }
    EXPECT_FALSE(host.empty());
    EXPECT_EQ(device, host) << "rank " << rank << ": not every collective has its device twin";
    EXPECT_EQ(device.count("all_reduce 2 12"), 1u) << "rank " << rank;
  }
}

TEST(DeviceTrack, TheSwitchIsReadFromTheEnvironmentAndABadValueNamesIt) {
  using cohort::trace::timeline_options_from_env;
  EXPECT_TRUE(timeline_options_from_env({{"COHORT_TIMELINE_DIR", "/tmp/t"}}).device_events());
  EXPECT_FALSE(
      timeline_options_from_env({{"COHORT_TIMELINE_DIR", "/tmp/t"}, {"COHORT_TIMELINE_DEVICE_EVENTS", "0"}})
          .device_events());
  try {
    timeline_options_from_env({{"COHORT_TIMELINE_DIR", "/tmp/t"}, {"COHORT_TIMELINE_DEVICE_EVENTS", "yes"}});
    FAIL() << "'yes' was accepted";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("COHORT_TIMELINE_DEVICE_EVENTS"), std::string::npos) << e.what();
  }
}

// The real clock says why it cannot be had: the CPU, a LibTorch before 2.4, or a
// CUDA LibTorch on a machine without a GPU (as CI's). On a GPU it is had.
TEST(DeviceTrack, TheEventClockRefusesTheCpuAndSaysWhyCudaIsMissing) {
  try {
    cohort::trace::event_clock(c10::Device(c10::kCPU), 1s);
    FAIL() << "a device clock for the CPU";
  } catch (const cohort::Error& e) {
    EXPECT_NE(std::string(e.what()).find("host's"), std::string::npos) << e.what();
  }
  const c10::Device gpu(c10::kCUDA, 0);
  if (torch::cuda::is_available()) {
    EXPECT_EQ(cohort::trace::event_clock(gpu, 10s)->device(), gpu);
    return;
  }
  try {
    cohort::trace::event_clock(gpu, 1s);
    FAIL() << "a device clock for a GPU that is not there";
  } catch (const cohort::Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("before 2.4") != std::string::npos || what.find("cuda:0") != std::string::npos) << what;
  }
}

}  // namespace
