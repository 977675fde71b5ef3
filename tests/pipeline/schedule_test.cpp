// The four schedules' action lists, run by the simulator: every list is complete and
// runs to the end, the simulated bubble equals the literature's formula, activations
// stay within each schedule's bound, and bad settings or broken lists are refused with
// the numbers, the rank and the action.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "cohort/errors.h"
#include "cohort/pipeline/simulator.h"

namespace {

using namespace cohort::pipeline;

Schedule build(ScheduleKind kind, int p, int m, int v = 1) {
  return make_schedule(ScheduleOptions().kind(kind).ranks(p).microbatches(m).virtual_stages(v));
}

// The ConfigError's message, or "" when none was thrown.
std::string config_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const cohort::ConfigError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::size_t position(const std::vector<Action>& list, ActionKind kind, int stage, int mb) {
  return std::find(list.begin(), list.end(), Action{kind, stage, mb}) - list.begin();
}

struct Shape {
  ScheduleKind kind;
  int p, m, v;
};

std::string name_of(const ::testing::TestParamInfo<Shape>& info) {
  auto kind = to_string(info.param.kind);
  kind.erase(std::remove(kind.begin(), kind.end(), '-'), kind.end());
  return kind + "_p" + std::to_string(info.param.p) + "_m" + std::to_string(info.param.m) + "_v" +
         std::to_string(info.param.v);
}

// GPipe with any m; 1F1B and zero-bubble with m >= p (m = p + 1 too, not a multiple);
// interleaved with m a multiple of p and v = 2, 3.
std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int p : {1, 2, 4}) {
    for (int m : {1, p, 2 * p, 3 * p}) out.push_back({ScheduleKind::kGPipe, p, m, 1});
    for (int m : {p, p + 1, 2 * p, 3 * p}) {
      out.push_back({ScheduleKind::k1F1B, p, m, 1});
      out.push_back({ScheduleKind::kZeroBubble, p, m, 1});
    }
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 3 * p}) out.push_back({ScheduleKind::kInterleaved, p, m, v});
  }
  // With p = 1 some of those coincide (m = 1 = p).
  auto same = [](const Shape& a, const Shape& b) { return a.kind == b.kind && a.p == b.p && a.m == b.m && a.v == b.v; };
  std::vector<Shape> unique;
  for (const auto& c : out)
    if (std::none_of(unique.begin(), unique.end(), [&](const Shape& u) { return same(u, c); })) unique.push_back(c);
  return unique;
}

class ScheduleShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(ScheduleShapes, ListsAreCompleteAndCrossRanksOnlyWhereTheNextStageIsRemote) {
  const auto c = GetParam();
  const auto s = build(c.kind, c.p, c.m, c.v);
  ASSERT_EQ(static_cast<int>(s.actions.size()), c.p);
  EXPECT_EQ(s.stages(), c.p * c.v);
  const bool split = c.kind == ScheduleKind::kZeroBubble;
  for (int r = 0; r < c.p; ++r) {
    const auto& list = s.actions[r];
    for (const auto& a : list) EXPECT_EQ(s.rank_of(a.stage), r) << to_string(a);
    for (int chunk = 0; chunk < c.v; ++chunk) {
      const int stage = chunk * c.p + r;
      const bool remote_prev = stage > 0 && s.rank_of(stage - 1) != r;
      const bool remote_next = stage + 1 < s.stages() && s.rank_of(stage + 1) != r;
      for (int m = 0; m < c.m; ++m) {
        auto at = [&](ActionKind k) { return position(list, k, stage, m); };
        const auto f = at(ActionKind::kForward);
        const auto b = split ? at(ActionKind::kBackwardInput) : at(ActionKind::kBackward);
        ASSERT_LT(f, list.size()) << "rank " << r << " F" << m << "@s" << stage;
        ASSERT_LT(b, list.size()) << "rank " << r << " backward of " << m << "@s" << stage;
        EXPECT_LT(f, b);
        EXPECT_EQ(at(ActionKind::kRecvActivation) < list.size(), remote_prev);
        EXPECT_EQ(at(ActionKind::kSendGradient) < list.size(), remote_prev);
        EXPECT_EQ(at(ActionKind::kSendActivation) < list.size(), remote_next);
        EXPECT_EQ(at(ActionKind::kRecvGradient) < list.size(), remote_next);
        // Each receive just before the action that needs it, each send just after.
        if (remote_prev) {
          EXPECT_EQ(at(ActionKind::kRecvActivation) + 1, f);
          EXPECT_EQ(at(ActionKind::kSendGradient), b + 1);
        }
        if (remote_next) {
          EXPECT_EQ(at(ActionKind::kSendActivation), f + 1);
          EXPECT_EQ(at(ActionKind::kRecvGradient) + 1, b);
        }
        if (split) {
          EXPECT_LT(b, at(ActionKind::kBackwardWeight));
        }
        EXPECT_EQ(at(ActionKind::kBackwardWeight) < list.size(), split);
        EXPECT_EQ(at(ActionKind::kBackward) < list.size(), !split);
      }
    }
  }
  EXPECT_NO_THROW(simulate(s));
  // Any costs and transfer times: whether a list runs to the end does not depend on them.
  EXPECT_NO_THROW(simulate(s, SimulationCosts().forward(0.7).backward_input(1.9).backward_weight(0.3).transfer(2.5)));
}

TEST_P(ScheduleShapes, SimulatedBubbleEqualsTheFormula) {
  const auto c = GetParam();
  const auto s = build(c.kind, c.p, c.m, c.v);
  const auto r = simulate(s, SimulationCosts().forward(1).backward_input(1).backward_weight(1).transfer(0));
  const auto f = formula_bubble(s);
  EXPECT_NEAR(f.is_ratio ? r.bubble_ratio : r.bubble_fraction, f.value, 1e-9);
  // Both views of the same idle time agree.
  const double busy = 3.0 * c.m * c.v * c.p;
  EXPECT_NEAR(r.bubble_fraction, r.bubble_ratio * busy / (c.p * r.makespan), 1e-9);
  for (double b : r.busy) EXPECT_DOUBLE_EQ(b, 3.0 * c.m * c.v);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, ScheduleShapes, ::testing::ValuesIn(shapes()), name_of);

TEST(ScheduleFormula, UsesEachPapersConvention) {
  auto gpipe = formula_bubble(build(ScheduleKind::kGPipe, 4, 8));
  EXPECT_FALSE(gpipe.is_ratio);
  EXPECT_DOUBLE_EQ(gpipe.value, 3.0 / 11);
  auto interleaved = formula_bubble(build(ScheduleKind::kInterleaved, 4, 8, 2));
  EXPECT_TRUE(interleaved.is_ratio);
  EXPECT_DOUBLE_EQ(interleaved.value, 3.0 / 16);
  auto zb = formula_bubble(build(ScheduleKind::kZeroBubble, 4, 8));
  EXPECT_TRUE(zb.is_ratio);
  EXPECT_DOUBLE_EQ(zb.value, 3.0 / 24);
}

TEST(ScheduleSimulation, TransferTimeDelaysTheReceivers) {
  // 1F1B, 2 ranks, 2 micro-batches, F = 1, B = 2, transfer 0.5, worked by hand:
  // rank 0: F0 [0,1] F1 [1,2] B0 [5,7] B1 [8,10]; rank 1: F0 [1.5,2.5] B0 [2.5,4.5]
  // F1 [4.5,5.5] B1 [5.5,7.5].
  auto r = simulate(build(ScheduleKind::k1F1B, 2, 2), SimulationCosts().transfer(0.5));
  EXPECT_DOUBLE_EQ(r.makespan, 10);
  EXPECT_DOUBLE_EQ(r.busy[0], 6);
  EXPECT_DOUBLE_EQ(r.busy[1], 6);
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 8.0 / 20);
  EXPECT_DOUBLE_EQ(r.bubble_ratio, 8.0 / 12);
}

TEST(ScheduleMemory, GPipeHoldsEveryMicroBatch1F1BAtMostPMinusRankZeroBubbleAtMostP) {
  for (int p : {1, 2, 4})
    for (int m : {p, 2 * p, 3 * p}) {
      const auto gpipe = simulate(build(ScheduleKind::kGPipe, p, m));
      const auto one = simulate(build(ScheduleKind::k1F1B, p, m));
      const auto zb = simulate(build(ScheduleKind::kZeroBubble, p, m));
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(gpipe.peak_activations[r], m) << "p=" << p << " m=" << m << " rank " << r;
        EXPECT_LE(one.peak_activations[r], p - r) << "p=" << p << " m=" << m << " rank " << r;
        EXPECT_EQ(one.peak_activations[r], std::min(m, p - r));
        // Note [ZB-H1]: 1F1B's p - r plus the r deferred W passes.
        EXPECT_EQ(zb.peak_activations[r], p) << "p=" << p << " m=" << m << " rank " << r;
      }
    }
}

TEST(ScheduleZeroBubble, WeightPassesFollowTheirInputPassInMicroBatchOrder) {
  const auto s = build(ScheduleKind::kZeroBubble, 4, 8);
  for (int r = 0; r < 4; ++r) {
    const auto& list = s.actions[r];
    int expected = 0;
    for (const auto& a : list) {
      if (a.kind != ActionKind::kBackwardWeight) continue;
      EXPECT_EQ(a.microbatch, expected++) << "rank " << r;
      EXPECT_LT(position(list, ActionKind::kBackwardInput, r, a.microbatch),
                position(list, ActionKind::kBackwardWeight, r, a.microbatch));
    }
    // Rank r runs p - r - 1 warm-up forwards and then one more before its first I,
    // like 1F1B, and ends with its r + 1 deferred W passes.
    auto first_i = std::find_if(list.begin(), list.end(), [](const Action& a) {
      return a.kind == ActionKind::kBackwardInput;
    });
    EXPECT_EQ(std::count_if(list.begin(), first_i, [](const Action& a) { return a.kind == ActionKind::kForward; }),
              4 - r);
    auto last_i = std::find_if(list.rbegin(), list.rend(), [](const Action& a) {
      return a.kind == ActionKind::kBackwardInput || a.kind == ActionKind::kSendGradient;
    });
    EXPECT_EQ(last_i - list.rbegin(), r + 1) << "rank " << r;
  }
}

TEST(ScheduleInterleaved, PlacesStageSOnRankSModPAndWalksChunksInRoundsOfP) {
  const auto s = build(ScheduleKind::kInterleaved, 2, 4, 2);
  // Rank 1 holds stages 1 and 3; its forwards go micro-batches 0, 1 through chunk 0,
  // then 0, 1 through chunk 1, then 2, 3 through chunk 0 ...
  std::vector<std::pair<int, int>> forwards;  // stage, micro-batch
  for (const auto& a : s.actions[1]) {
    EXPECT_TRUE(a.stage == 1 || a.stage == 3) << to_string(a);
    if (a.kind == ActionKind::kForward) forwards.emplace_back(a.stage, a.microbatch);
  }
  const std::vector<std::pair<int, int>> expected{{1, 0}, {1, 1}, {3, 0}, {3, 1}, {1, 2}, {1, 3}, {3, 2}, {3, 3}};
  EXPECT_EQ(forwards, expected);
  // Stage 1 to stage 2 crosses from rank 1 to rank 0, so chunk boundaries send too.
  EXPECT_LT(position(s.actions[1], ActionKind::kSendActivation, 1, 0), s.actions[1].size());
  EXPECT_LT(position(s.actions[0], ActionKind::kRecvActivation, 2, 0), s.actions[0].size());
  // With one rank every stage is local: nothing is sent.
  const auto single = build(ScheduleKind::kInterleaved, 1, 3, 3);
  for (const auto& a : single.actions[0])
    EXPECT_TRUE(a.kind == ActionKind::kForward || a.kind == ActionKind::kBackward) << to_string(a);
}

TEST(ScheduleNames, ActionsPrintKindMicroBatchAndStage) {
  EXPECT_EQ(to_string(Action{ActionKind::kForward, 1, 3}), "F3@s1");
  EXPECT_EQ(to_string(Action{ActionKind::kBackward, 0, 0}), "B0@s0");
  EXPECT_EQ(to_string(Action{ActionKind::kBackwardInput, 2, 5}), "I5@s2");
  EXPECT_EQ(to_string(Action{ActionKind::kBackwardWeight, 2, 5}), "W5@s2");
  EXPECT_EQ(to_string(Action{ActionKind::kSendActivation, 0, 1}), "SA1@s0");
  EXPECT_EQ(to_string(Action{ActionKind::kRecvActivation, 1, 1}), "RA1@s1");
  EXPECT_EQ(to_string(Action{ActionKind::kSendGradient, 1, 2}), "SG2@s1");
  EXPECT_EQ(to_string(Action{ActionKind::kRecvGradient, 0, 2}), "RG2@s0");
}

TEST(ScheduleNames, ParsesTheFourKindsAndListsThemWhenWrong) {
  for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved, ScheduleKind::kZeroBubble})
    EXPECT_EQ(parse_schedule_kind(to_string(kind)), kind);
  EXPECT_EQ(parse_schedule_kind("gpipe"), ScheduleKind::kGPipe);
  EXPECT_EQ(parse_schedule_kind("1f1b"), ScheduleKind::k1F1B);
  EXPECT_EQ(parse_schedule_kind("interleaved"), ScheduleKind::kInterleaved);
  EXPECT_EQ(parse_schedule_kind("zero-bubble"), ScheduleKind::kZeroBubble);
  EXPECT_EQ(parse_schedule_kind("zb1p"), ScheduleKind::kZeroBubble);
  const auto message = config_error([] { parse_schedule_kind("1F1B-interleaved"); });
  EXPECT_TRUE(contains(message, "'1F1B-interleaved'")) << message;
  for (const char* name : {"gpipe", "1f1b", "interleaved", "zero-bubble"})
    EXPECT_TRUE(contains(message, name)) << message;
}

TEST(ScheduleErrors, SettingsItCannotRunAreRefusedNamingTheNumbersAndTheFix) {
  auto m = config_error([] { build(ScheduleKind::k1F1B, 4, 3); });
  EXPECT_TRUE(contains(m, "3 micro-batches for 4 ranks") && contains(m, "use 4 micro-batches or more, or gpipe")) << m;
  m = config_error([] { build(ScheduleKind::kZeroBubble, 4, 2); });
  EXPECT_TRUE(contains(m, "2 micro-batches for 4 ranks") && contains(m, "use 4 micro-batches")) << m;
  m = config_error([] { build(ScheduleKind::kInterleaved, 4, 6, 2); });
  EXPECT_TRUE(contains(m, "4 pipeline ranks, got 6") && contains(m, "use 4 or 8")) << m;
  m = config_error([] { build(ScheduleKind::kInterleaved, 4, 2, 2); });
  EXPECT_TRUE(contains(m, "got 2; use 4")) << m;
  m = config_error([] { build(ScheduleKind::kInterleaved, 2, 4, 1); });
  EXPECT_TRUE(contains(m, "at least 2 virtual stages per rank, got 1") && contains(m, "1f1b")) << m;
  m = config_error([] { build(ScheduleKind::k1F1B, 2, 4, 2); });
  EXPECT_TRUE(contains(m, "2 virtual stages") && contains(m, "interleaved")) << m;
  m = config_error([] { build(ScheduleKind::kZeroBubble, 2, 4, 3); });
  EXPECT_TRUE(contains(m, "3 virtual stages")) << m;
  m = config_error([] { build(ScheduleKind::kGPipe, 0, 2); });
  EXPECT_TRUE(contains(m, "ranks (0)")) << m;
  m = config_error([] { build(ScheduleKind::kGPipe, 2, 0); });
  EXPECT_TRUE(contains(m, "micro-batches (0)")) << m;
  m = config_error([] { build(ScheduleKind::kInterleaved, 2, 2, 0); });
  EXPECT_TRUE(contains(m, "virtual stages (0)")) << m;
  // GPipe has no minimum on micro-batches.
  EXPECT_NO_THROW(build(ScheduleKind::kGPipe, 4, 1));
}

// 1F1B on 2 ranks with 2 micro-batches: rank 0 runs F0 SA0 F1 SA1 RG0 B0 RG1 B1,
// rank 1 runs RA0 F0 B0 SG0 RA1 F1 B1 SG1.
Schedule two_rank_1f1b() { return build(ScheduleKind::k1F1B, 2, 2); }

void move_after(std::vector<Action>& list, const Action& moved, const Action& anchor) {
  list.erase(std::find(list.begin(), list.end(), moved));
  list.insert(std::find(list.begin(), list.end(), anchor) + 1, moved);
}

TEST(SimulatorRefuses, ACycleOfWaitsNamingEachRankItsActionAndWhatItWaitsFor) {
  // Rank 0 sends micro-batch 0's activation only after receiving its gradient.
  auto s = two_rank_1f1b();
  move_after(s.actions[0], {ActionKind::kSendActivation, 0, 0}, {ActionKind::kRecvGradient, 0, 0});
  const auto m = config_error([&] { simulate(s); });
  EXPECT_TRUE(contains(m, "rank 0 would wait forever at RG0@s0")) << m;
  EXPECT_TRUE(contains(m, "for SG0@s1 on rank 1 (micro-batch 0's output gradient from stage 1)")) << m;
  EXPECT_TRUE(contains(m, "rank 1 would wait forever at RA0@s1")) << m;
  EXPECT_TRUE(contains(m, "for SA0@s0 on rank 0 (micro-batch 0's activation from stage 0)")) << m;
  EXPECT_TRUE(contains(m, "which rank 0 only reaches after its own wait at RG0@s0")) << m;
}

TEST(SimulatorRefuses, SwappedReceives) {
  // Rank 1 receives micro-batch 1's activation first, then runs F0 before RA0.
  auto s = two_rank_1f1b();
  auto& l = s.actions[1];
  std::iter_swap(std::find(l.begin(), l.end(), Action{ActionKind::kRecvActivation, 1, 0}),
                 std::find(l.begin(), l.end(), Action{ActionKind::kRecvActivation, 1, 1}));
  const auto m = config_error([&] { simulate(s); });
  EXPECT_TRUE(contains(m, "rank 1 would wait forever at F0@s1")) << m;
  EXPECT_TRUE(contains(m, "for RA0@s1 on rank 1")) << m;
  EXPECT_TRUE(contains(m, "which comes later in the same list")) << m;
  EXPECT_TRUE(contains(m, "rank 0 would wait forever at RG0@s0")) << m;
}

TEST(SimulatorRefuses, MissingActions) {
  auto s = two_rank_1f1b();
  auto& l1 = s.actions[1];
  l1.erase(std::find(l1.begin(), l1.end(), Action{ActionKind::kBackward, 1, 1}));
  auto m = config_error([&] { simulate(s); });
  EXPECT_TRUE(contains(m, "rank 1 never runs B (or I and W) for micro-batch 1 of stage 1")) << m;

  // A send nobody posts: the receive waits forever.
  s = two_rank_1f1b();
  auto& l0 = s.actions[0];
  l0.erase(std::find(l0.begin(), l0.end(), Action{ActionKind::kSendActivation, 0, 1}));
  m = config_error([&] { simulate(s); });
  EXPECT_TRUE(contains(m, "rank 1 would wait forever at RA1@s1")) << m;
  EXPECT_TRUE(contains(m, "which is not in rank 0's list")) << m;

  // A receive left out: the forward has no input.
  s = two_rank_1f1b();
  auto& r1 = s.actions[1];
  r1.erase(std::find(r1.begin(), r1.end(), Action{ActionKind::kRecvActivation, 1, 0}));
  m = config_error([&] { simulate(s); });
  EXPECT_TRUE(contains(m, "rank 1 would wait forever at F0@s1")) << m;

  // Zero-bubble without one W.
  s = build(ScheduleKind::kZeroBubble, 2, 2);
  auto& z = s.actions[0];
  z.erase(std::find(z.begin(), z.end(), Action{ActionKind::kBackwardWeight, 0, 1}));
  m = config_error([&] { simulate(s); });
  EXPECT_TRUE(contains(m, "rank 0 never runs W for micro-batch 1 of stage 0")) << m;

  s = two_rank_1f1b();
  s.actions.pop_back();
  m = config_error([&] { simulate(s); });
  EXPECT_TRUE(contains(m, "2 ranks but action lists for 1")) << m;
}

TEST(SimulatorRefuses, RepeatedMisplacedAndPeerlessActions) {
  auto s = two_rank_1f1b();
  s.actions[0].push_back({ActionKind::kForward, 0, 0});
  auto m = config_error([&] { simulate(s); });
  EXPECT_TRUE(contains(m, "rank 0 runs F0@s0 twice")) << m;

  s = two_rank_1f1b();
  s.actions[0].push_back({ActionKind::kForward, 1, 0});
  m = config_error([&] { simulate(s); });
  EXPECT_TRUE(contains(m, "rank 0's action F0@s1 is for stage 1, which lives on rank 1")) << m;

  s = two_rank_1f1b();
  s.actions[1].push_back({ActionKind::kSendActivation, 1, 0});
  m = config_error([&] { simulate(s); });
  EXPECT_TRUE(contains(m, "rank 1's action SA0@s1 has no peer")) << m;

  s = build(ScheduleKind::kInterleaved, 1, 2, 2);
  s.actions[0].insert(s.actions[0].begin(), {ActionKind::kRecvActivation, 1, 0});
  m = config_error([&] { simulate(s); });
  EXPECT_TRUE(contains(m, "stage 0 before it is on the same rank")) << m;

  s = two_rank_1f1b();
  s.actions[0].push_back({ActionKind::kBackwardInput, 0, 0});
  m = config_error([&] { simulate(s); });
  EXPECT_TRUE(contains(m, "both B and I/W for micro-batch 0 of stage 0")) << m;

  s = two_rank_1f1b();
  s.actions[1].push_back({ActionKind::kForward, 1, 7});
  m = config_error([&] { simulate(s); });
  EXPECT_TRUE(contains(m, "names micro-batch 7")) << m;
}

}  // namespace
