// The timeline on its own (window, cap, file format, merge) and, with ranks as
// threads, what the world and DDP put on it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "cohort/trace/chrome_trace.h"
#include "cohort/trace/step_profiler.h"
#include "cohort/trace/timeline.h"
#include "cohort/trace/world_timeline.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace {

using cohort::trace::Timeline;
using cohort::trace::TimelineOptions;
using nlohmann::json;
namespace fs = std::filesystem;

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

std::vector<json> non_metadata(const json& doc) {
  std::vector<json> out;
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") != "M") out.push_back(e);
  return out;
}

TEST(TimelineOptions, StepsParseAndBadOnesNameTheFlag) {
  auto o = TimelineOptions().steps_from_string("20:40", "--timeline-steps");
  EXPECT_EQ(o.first_step(), 20);
  EXPECT_EQ(o.last_step(), 40);
  o = TimelineOptions().steps_from_string("7:", "--timeline-steps");
  EXPECT_EQ(o.first_step(), 7);
  EXPECT_EQ(o.last_step(), -1);
  o = TimelineOptions().steps_from_string("3", "--timeline-steps");
  EXPECT_EQ(o.first_step(), 3);
  EXPECT_EQ(o.last_step(), 3);
  for (const char* bad : {"", "a:b", "5:2", "-1:4", "1:2:3"}) {
    try {
      TimelineOptions().steps_from_string(bad, "--timeline-steps");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--timeline-steps"), std::string::npos) << e.what();
    }
  }
}

// `cohort run --timeline` reaches a worker only through these variables, which
// traced() turns into a recorder for World::init; without them it adds none.
TEST(TimelineOptions, TracedReadsTheLaunchersVariablesAndAddsARecorderOnlyWhenAsked) {
  const auto options = cohort::trace::timeline_options_from_env(
      {{"COHORT_TIMELINE_DIR", "/tmp/t"}, {"COHORT_TIMELINE_STEPS", "3:5"}, {"COHORT_TIMELINE_MAX_EVENTS", "7"}});
  EXPECT_EQ(options.directory(), "/tmp/t");
  EXPECT_EQ(options.first_step(), 3);
  EXPECT_EQ(options.last_step(), 5);
  EXPECT_EQ(options.max_events(), 7u);
  EXPECT_TRUE(cohort::trace::traced({{"COHORT_TIMELINE_DIR", "/tmp/t"}, {"COHORT_TIMEOUT", "9"}}).recorder());
  EXPECT_EQ(cohort::trace::traced({{"COHORT_TIMEOUT", "9"}}).timeout(), std::chrono::seconds(9));
  EXPECT_FALSE(cohort::trace::traced({{"COHORT_TIMEOUT", "9"}}).recorder());
  try {
    cohort::trace::timeline_options_from_env({{"COHORT_TIMELINE_DIR", "/tmp/t"}, {"COHORT_TIMELINE_MAX_EVENTS", "0"}});
    FAIL() << "a cap of 0 events was accepted";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("COHORT_TIMELINE_MAX_EVENTS"), std::string::npos) << e.what();
  }
}

TEST(Timeline, RecordsOnlyInsideTheWindowAndCountsWhatTheCapDrops) {
  cohort::testing::TempDir dir;
  {
    Timeline t(3, TimelineOptions().directory(dir.path).first_step(2).last_step(3).max_events(3));
    for (int step = 0; step < 6; ++step) {
      t.set_step(step);
      cohort::trace::Span s(&t, "step");
    }
    EXPECT_EQ(t.size(), 2u);  // steps 2 and 3
    EXPECT_EQ(t.dropped(), 0u);
    t.set_step(2);
    for (int i = 0; i < 3; ++i) t.instant("mark", "test", Timeline::now_us());
    EXPECT_EQ(t.size(), 3u);
    EXPECT_EQ(t.dropped(), 2u);
  }  // written by the destructor
  const auto doc = read_json(fs::path(dir.path) / "rank-3.json");
  EXPECT_EQ(doc.at("otherData").at("dropped_events"), 2);
  for (const auto& e : non_metadata(doc)) {
    EXPECT_EQ(e.at("pid"), 3);
    const auto step = e.at("args").at("step").get<int>();
    EXPECT_TRUE(step == 2 || step == 3) << e.dump();
  }
}

// A collective is an async pair (begin, end): at the cap it is kept whole or dropped
// whole, never a begin without its end (an event the viewers leave open to the end
// of the trace). The place it could not use is left to a later event of one place.
TEST(Timeline, ACollectiveAtTheCapIsKeptWholeOrNotAtAll) {
  cohort::testing::TempDir dir;
  {
    Timeline t(0, TimelineOptions().directory(dir.path).max_events(4));
    t.set_step(0);
    const double now = Timeline::now_us();
    t.span("forward", "phase", now, now + 10);
    t.async("all_reduce", "collective", now, now + 5, 64);
    EXPECT_EQ(t.size(), 3u);
    t.async("all_reduce", "collective", now + 5, now + 9, 64);  // 2 places wanted, 1 left
    EXPECT_EQ(t.size(), 3u);
    EXPECT_EQ(t.dropped(), 2u);
    t.instant("mark", "test", now + 9);
    EXPECT_EQ(t.size(), 4u);
    EXPECT_EQ(t.dropped(), 2u);
  }
  const auto doc = read_json(fs::path(dir.path) / "rank-0.json");
  EXPECT_EQ(doc.at("otherData").at("dropped_events"), 2);
  int begins = 0, ends = 0;
  for (const auto& e : non_metadata(doc)) {
    begins += e.at("ph") == "b";
    ends += e.at("ph") == "e";
  }
  EXPECT_EQ(begins, 1);
  EXPECT_EQ(ends, 1);
}

TEST(Timeline, SpansAreWrittenParentFirstWithTheClockOffsetApplied) {
  cohort::testing::TempDir dir;
  Timeline t(0, TimelineOptions().directory(dir.path));
  t.set_clock_offset_us(1000);
  t.span("inner", "test", 110, 120);   // recorded first, as spans are when they end
  t.span("outer", "test", 100, 200);
  t.async("all_reduce", "collective", 150, 400, 4096);
  t.write();
  const auto events = non_metadata(read_json(t.path()));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].at("name"), "outer");
  EXPECT_EQ(events[0].at("ts").get<double>(), 1100);
  EXPECT_EQ(events[0].at("dur").get<double>(), 100);
  EXPECT_EQ(events[1].at("name"), "inner");
  EXPECT_EQ(events[2].at("ph"), "b");
  EXPECT_EQ(events[2].at("args").at("bytes"), 4096);
  EXPECT_EQ(events[3].at("ph"), "e");
  EXPECT_EQ(events[2].at("id"), events[3].at("id"));
}

TEST(Timeline, AnUnwritableDirectoryIsAnErrorNamingIt) {
  Timeline t(0, TimelineOptions().directory("/proc/cohort-cannot-exist"));
  try {
    t.write();
    FAIL() << "wrote into /proc";
  } catch (const cohort::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/cohort-cannot-exist"), std::string::npos) << e.what();
  }
}

TEST(ChromeTrace, MergeRefusesAFileThatIsNotATrace) {
  cohort::testing::TempDir dir;
  { Timeline(0, TimelineOptions().directory(dir.path)).write(); }
  std::ofstream(fs::path(dir.path) / "rank-1.json") << "{ not json";
  try {
    cohort::trace::merge_chrome_traces(dir.path, (fs::path(dir.path) / "out.json").string());
    FAIL() << "merged a broken file";
  } catch (const cohort::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank-1.json"), std::string::npos) << e.what();
  }
}

TEST(StepProfiler, SumsPhasesAndLeavesTheWaitOutOfTheStepTimes) {
  cohort::trace::StepProfiler p;
  for (int step = 1; step <= 3; ++step) {
    p.begin_step(step);
    { auto ph = p.phase("forward"); }
    { auto ph = p.phase("backward"); }
    p.end_step(/*waited_s=*/1e9);  // more than the step: clamped at 0
  }
  EXPECT_EQ(p.steps(), 3);
  const auto phases = p.phase_seconds();
  ASSERT_EQ(phases.size(), 2u);
  EXPECT_EQ(phases[0].first, "forward");
  EXPECT_EQ(phases[1].first, "backward");
  EXPECT_EQ(p.work_times().size(), 3u);
  EXPECT_EQ(p.work_times().summary().median_s, 0);
  EXPECT_GT(p.step_seconds(), 0);
}

// With ranks as threads over one store: the world hands its timeline to DDP, whose
// buckets and collectives land on it; threads of one process share a clock.
TEST(Timeline, TheWorldsGroupsAndDdpRecordOnIt) {
  cohort::testing::TempDir dir;
  torch::manual_seed(0);
  const auto x = torch::randn({8, 16});
  const auto y = torch::randn({8, 4});
  auto options = cohort::testing::quick_thread_world_options();
  options = cohort::trace::traced(options, TimelineOptions().directory(dir.path));
  cohort::testing::run_thread_world(
      2,
      [&](cohort::comm::World& world) {
        auto timeline = cohort::trace::timeline_of(world);
        ASSERT_NE(timeline, nullptr);
        EXPECT_EQ(timeline.get(), world.group().recorder());
        EXPECT_EQ(timeline->clock_offset_us(), 0);
        auto model = torch::nn::Linear(16, 4);
        cohort::ddp::DistributedDataParallel ddp(model, world.group());
        for (int step = 1; step <= 2; ++step) {
          cohort::trace::step(timeline.get(), step);
          torch::mse_loss(ddp(x), y).backward();
        }
        timeline->write();
      },
      options);
  for (int rank = 0; rank < 2; ++rank) {
    std::set<std::string> names;
    const auto events = non_metadata(read_json(fs::path(dir.path) / ("rank-" + std::to_string(rank) + ".json")));
    for (const auto& e : events)
      names.insert(e.at("name").get<std::string>());
    for (const char* n : {"bucket 0", "bucket 0 ready", "all_reduce", "broadcast", "ddp wait and copy back"})
      EXPECT_TRUE(names.count(n)) << n << " missing on rank " << rank;
  }
}

}  // namespace
