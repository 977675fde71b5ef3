// Note [Restart pacing] as pure logic: the pauses a crash loop gets, and what resets them.
#include <gtest/gtest.h>

#include "cohort/launcher/restart_pacing.h"

namespace {

using cohort::launcher::restart_pacing_for;
using cohort::launcher::RestartPacing;
using cohort::launcher::RestartPacingOptions;
using Millis = std::chrono::milliseconds;
using std::chrono::seconds;

TEST(RestartPacing, ACrashLoopBacksOffByDoublingUpToTheCap) {
  RestartPacing pacing(restart_pacing_for(0.1));
  std::vector<Millis> pauses;
  for (int i = 0; i < 9; ++i) pauses.push_back(pacing.after_failure(Millis(20)));
  EXPECT_EQ(pauses, (std::vector<Millis>{Millis(100), seconds(1), seconds(2), seconds(4), seconds(8), seconds(16),
                                         seconds(30), seconds(30), seconds(30)}));
  EXPECT_EQ(pacing.quick_failures(), 9);
  // Many more stay at the cap (no overflow).
  for (int i = 0; i < 100; ++i) EXPECT_EQ(pacing.after_failure(Millis(0)), seconds(30));
}

TEST(RestartPacing, AGroupThatRanLongRestartsAfterTheMonitorIntervalAndResetsTheBackoff) {
  RestartPacing pacing(restart_pacing_for(0.5));
  EXPECT_EQ(pacing.after_failure(seconds(600)), Millis(500)) << "a job that trained a while restarts at once";
  EXPECT_EQ(pacing.after_failure(seconds(1)), Millis(500)) << "the first quick failure is not a loop yet";
  EXPECT_EQ(pacing.after_failure(seconds(1)), seconds(1));
  EXPECT_EQ(pacing.after_failure(seconds(1)), seconds(2));
  EXPECT_EQ(pacing.after_failure(seconds(10)), Millis(500)) << "ran for quick_run: the streak is over";
  EXPECT_EQ(pacing.quick_failures(), 0);
  EXPECT_EQ(pacing.after_failure(Millis(9'999)), Millis(500));
  EXPECT_EQ(pacing.after_failure(Millis(9'999)), seconds(1));
}

TEST(RestartPacing, TheOptionsShapeThePauses) {
  RestartPacing pacing(RestartPacingOptions()
                           .min_pause(Millis(0))
                           .first_backoff(Millis(300))
                           .max_pause(Millis(1'000))
                           .quick_run(seconds(2)));
  EXPECT_EQ(pacing.after_failure(Millis(0)), Millis(0));
  EXPECT_EQ(pacing.after_failure(Millis(0)), Millis(300));
  EXPECT_EQ(pacing.after_failure(Millis(0)), Millis(600));
  EXPECT_EQ(pacing.after_failure(Millis(0)), Millis(1'000));
  EXPECT_EQ(pacing.after_failure(seconds(2)), Millis(0));
  // A monitor interval longer than the backoff is never undercut.
  RestartPacing slow(restart_pacing_for(5.0));
  slow.after_failure(Millis(0));
  EXPECT_EQ(slow.after_failure(Millis(0)), seconds(5));
}

TEST(RestartPacing, OnlyABackoffIsExplained) {
  RestartPacing pacing;
  EXPECT_EQ(pacing.explain(pacing.after_failure(Millis(0))), "");
  const auto text = pacing.explain(pacing.after_failure(Millis(0)));
  EXPECT_NE(text.find("failed 2 times in a row within 10 s of starting; waiting 1.0 s"), std::string::npos) << text;
}

}  // namespace
