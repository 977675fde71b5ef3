// Schedules as action lists, checked by the simulator: each schedule's bubble equals
// its formula, memory stays within its bound, bad settings and deadlocking lists are
// refused naming the numbers, the rank and the action.
#include <gtest/gtest.h>

#include <algorithm>

#include "cohort/errors.h"
#include "cohort/pipeline/simulator.h"

namespace {

using namespace cohort::pipeline;

Schedule make(ScheduleKind kind, int p, int m, int v = 1) {
  return make_schedule(ScheduleOptions().kind(kind).ranks(p).microbatches(m).virtual_stages(v));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const cohort::ConfigError& e) {
    return e.what();
  }
  return "";
}

struct Case {
  ScheduleKind kind;
  int p, m, v;
};

class Bubble : public ::testing::TestWithParam<Case> {};

TEST_P(Bubble, SimulatedEqualsTheFormula) {
  const auto c = GetParam();
  auto s = make(c.kind, c.p, c.m, c.v);
  auto r = simulate(s);
  auto f = formula_bubble(s);
  EXPECT_NEAR(f.is_ratio ? r.bubble_ratio : r.bubble_fraction, f.value, 1e-12)
      << to_string(c.kind) << " p=" << c.p << " m=" << c.m << " v=" << c.v;
  // The ideal time is each rank's work: m micro-batches of F, I and W per chunk.
  EXPECT_NEAR(r.busy[0], 3.0 * c.m * c.v, 1e-12);
}

std::vector<Case> bubble_cases() {
  std::vector<Case> out;
  for (int p : {1, 2, 3, 4, 8})
    for (int k : {1, 2, 3, 4}) {
      out.push_back({ScheduleKind::kGPipe, p, k, 1});
      out.push_back({ScheduleKind::kGPipe, p, k * p, 1});
      out.push_back({ScheduleKind::k1F1B, p, k * p, 1});
      out.push_back({ScheduleKind::k1F1B, p, k * p + 1, 1});
      out.push_back({ScheduleKind::kZeroBubble, p, k * p, 1});
      out.push_back({ScheduleKind::kZeroBubble, p, k * p + 1, 1});
      for (int v : {2, 3}) out.push_back({ScheduleKind::kInterleaved, p, k * p, v});
    }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Schedules, Bubble, ::testing::ValuesIn(bubble_cases()));

TEST(Memory, GPipeHoldsEveryMicroBatchAnd1F1BAtMostPMinusRank) {
  for (int p : {2, 4})
    for (int m : {p, 2 * p, 4 * p}) {
      auto g = simulate(make(ScheduleKind::kGPipe, p, m));
      auto o = simulate(make(ScheduleKind::k1F1B, p, m));
      auto z = simulate(make(ScheduleKind::kZeroBubble, p, m));
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(g.peak_activations[r], m);
        EXPECT_EQ(o.peak_activations[r], std::min(m, p - r));
        EXPECT_LE(z.peak_activations[r], std::min(m, 2 * p - 1 - r));  // Note [ZB1P by list scheduling]
      }
    }
}

TEST(Schedule, ListsHaveTheirTransfersAndZeroBubbleSplitsBackward) {
  auto s = make(ScheduleKind::kZeroBubble, 2, 2);
  auto has = [&](int rank, ActionKind kind, int stage, int mb) {
    const auto& l = s.actions[rank];
    return std::find(l.begin(), l.end(), Action{kind, stage, mb}) != l.end();
  };
  EXPECT_TRUE(has(0, ActionKind::kSendActivation, 0, 1));
  EXPECT_TRUE(has(1, ActionKind::kRecvActivation, 1, 1));
  EXPECT_TRUE(has(1, ActionKind::kSendGradient, 1, 0));
  EXPECT_TRUE(has(0, ActionKind::kRecvGradient, 0, 0));
  EXPECT_TRUE(has(0, ActionKind::kBackwardInput, 0, 1));
  EXPECT_TRUE(has(0, ActionKind::kBackwardWeight, 0, 1));
  EXPECT_FALSE(has(0, ActionKind::kBackward, 0, 1));
  EXPECT_FALSE(has(0, ActionKind::kSendGradient, 0, 0));  // stage 0 has nobody to send to
  EXPECT_EQ(to_string(Action{ActionKind::kRecvGradient, 0, 3}), "RG3@s0");
  // Interleaved: stage s on rank s % p, so rank 1 of 2 holds stages 1 and 3.
  auto i = make(ScheduleKind::kInterleaved, 2, 2, 2);
  for (const auto& a : i.actions[1]) EXPECT_TRUE(a.stage == 1 || a.stage == 3) << to_string(a);
}

TEST(Simulator, NamesTheRankAndTheActionOfADeadlock) {
  // 1F1B on 2 ranks, with rank 0 waiting for micro-batch 0's gradient before it sends
  // micro-batch 0's activation: each rank waits for the other.
  auto s = make(ScheduleKind::k1F1B, 2, 2);
  auto& l = s.actions[0];
  auto send = std::find(l.begin(), l.end(), Action{ActionKind::kSendActivation, 0, 0});
  auto recv = std::find(l.begin(), l.end(), Action{ActionKind::kRecvGradient, 0, 0});
  ASSERT_TRUE(send != l.end() && recv != l.end());
  const Action moved = *send;
  l.erase(send);
  recv = std::find(l.begin(), l.end(), Action{ActionKind::kRecvGradient, 0, 0});
  l.insert(recv + 1, moved);
  auto message = error_of([&] { simulate(s); });
  EXPECT_NE(message.find("deadlocks"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0 would wait forever at RG0@s0"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 1 would wait forever at RA0@s1"), std::string::npos) << message;
  EXPECT_NE(message.find("for SA0@s0 on rank 0"), std::string::npos) << message;
}

TEST(Simulator, RefusesMissingAndRepeatedActions) {
  auto s = make(ScheduleKind::kGPipe, 2, 2);
  auto& l = s.actions[1];
  l.erase(std::find(l.begin(), l.end(), Action{ActionKind::kBackward, 1, 1}));
  EXPECT_NE(error_of([&] { simulate(s); }).find("rank 1 never runs B (or I and W) for micro-batch 1 of stage 1"),
            std::string::npos);
  auto t = make(ScheduleKind::kGPipe, 2, 2);
  t.actions[0].push_back({ActionKind::kForward, 0, 0});
  EXPECT_NE(error_of([&] { simulate(t); }).find("rank 0 runs F0@s0 twice"), std::string::npos);
  auto u = make(ScheduleKind::kGPipe, 2, 2);
  u.actions[0].push_back({ActionKind::kForward, 1, 0});
  EXPECT_NE(error_of([&] { simulate(u); }).find("which lives on rank 1"), std::string::npos);
}

TEST(Schedule, RefusesSettingsItCannotRunNamingTheNumbers) {
  auto m = error_of([] { make(ScheduleKind::k1F1B, 4, 3); });
  EXPECT_NE(m.find("3 micro-batches for 4 ranks; use 4 micro-batches or more, or gpipe"), std::string::npos) << m;
  m = error_of([] { make(ScheduleKind::kZeroBubble, 4, 2); });
  EXPECT_NE(m.find("2 micro-batches for 4 ranks"), std::string::npos) << m;
  m = error_of([] { make(ScheduleKind::kInterleaved, 4, 6, 2); });
  EXPECT_NE(m.find("multiple of the 4 pipeline ranks, got 6; use 4 or 8"), std::string::npos) << m;
  m = error_of([] { make(ScheduleKind::kInterleaved, 2, 2, 1); });
  EXPECT_NE(m.find("at least 2 virtual stages"), std::string::npos) << m;
  m = error_of([] { make(ScheduleKind::k1F1B, 2, 2, 2); });
  EXPECT_NE(m.find("use --pipeline-schedule interleaved"), std::string::npos) << m;
  m = error_of([] { make(ScheduleKind::kGPipe, 0, 2); });
  EXPECT_NE(m.find("ranks (0)"), std::string::npos) << m;
  EXPECT_EQ(parse_schedule_kind("zb1p"), ScheduleKind::kZeroBubble);
  m = error_of([] { parse_schedule_kind("pipedream"); });
  EXPECT_NE(m.find("use gpipe, 1f1b, interleaved or zero-bubble"), std::string::npos) << m;
}

}  // namespace
