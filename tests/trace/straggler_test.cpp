// The straggler report's arithmetic, and its gathering with ranks as threads.
#include <gtest/gtest.h>

#include "cohort/errors.h"
#include "cohort/trace/step_stats.h"
#include "cohort/trace/straggler.h"
#include "support/thread_world.h"

namespace {

using cohort::trace::StepSummary;

TEST(StepStats, MedianAndNearestRankP90) {
  auto s = cohort::trace::summarize({5, 1, 4, 2, 3, 10, 6, 7, 8, 9});
  EXPECT_EQ(s.count, 10);
  EXPECT_DOUBLE_EQ(s.median_s, 5.5);
  EXPECT_DOUBLE_EQ(s.p90_s, 9);
  s = cohort::trace::summarize({3, 1, 2});
  EXPECT_DOUBLE_EQ(s.median_s, 2);
  EXPECT_DOUBLE_EQ(s.p90_s, 3);
  EXPECT_EQ(cohort::trace::summarize({}).count, 0);
  cohort::trace::StepTimes times;
  for (double v : {9.0, 9.0, 1.0, 2.0, 3.0}) times.add(v);
  EXPECT_DOUBLE_EQ(times.summary(2).median_s, 2);  // the window after a periodic report
}

TEST(StragglerReport, NamesTheRanksOverTheThresholdWithTheirScore) {
  std::vector<StepSummary> per_rank{{10, 0.010, 0.012}, {10, 0.011, 0.013}, {10, 0.020, 0.030}, {10, 0.0125, 0.02}};
  auto report = cohort::trace::make_straggler_report(per_rank, cohort::trace::StragglerOptions().threshold(0.2));
  EXPECT_EQ(report.stragglers(), (std::vector<int>{2, 3}));
  EXPECT_DOUBLE_EQ(report.ranks[0].score, 1.0);
  EXPECT_DOUBLE_EQ(report.ranks[2].score, 0.5);
  const auto text = report.format("title");
  EXPECT_NE(text.find("stragglers: ranks 2, 3 "), std::string::npos) << text;
  EXPECT_NE(text.find("20.00"), std::string::npos) << text;  // rank 2's median in ms
}

TEST(StragglerReport, ABalancedWorldNamesNoOne) {
  std::vector<StepSummary> per_rank{{10, 0.010, 0.012}, {10, 0.0105, 0.013}};
  auto report = cohort::trace::make_straggler_report(per_rank);
  EXPECT_TRUE(report.stragglers().empty());
  EXPECT_NE(report.format("t").find("no straggler"), std::string::npos);
  EXPECT_THROW(cohort::trace::make_straggler_report(per_rank, cohort::trace::StragglerOptions().threshold(-1)),
               cohort::ConfigError);
}

TEST(StragglerReport, EveryRankGathersTheSameReport) {
  std::vector<std::vector<int>> seen(3);
  cohort::testing::run_thread_world(3, [&](cohort::comm::World& world) {
    StepSummary mine{20, world.rank() == 1 ? 0.05 : 0.01, 0.06};
    auto report = cohort::trace::gather_straggler_report(world.group(), world.device(), mine);
    ASSERT_EQ(report.ranks.size(), 3u);
    seen[static_cast<std::size_t>(world.rank())] = report.stragglers();
  });
  for (const auto& s : seen) EXPECT_EQ(s, (std::vector<int>{1}));
}

}  // namespace
