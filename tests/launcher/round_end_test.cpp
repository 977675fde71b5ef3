// How the elastic agent reads a failed round: a failure (costs a restart) or a lost
// node (a membership change, free). Agents on threads over one in-memory store.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <future>
#include <thread>

#include "cohort/elastic/dynamic_rendezvous.h"
#include "cohort/launcher/round_end.h"

namespace {

using cohort::elastic::DynamicRendezvous;
using cohort::elastic::Millis;
using cohort::elastic::RendezvousSettings;
using cohort::elastic::Round;
using cohort::launcher::classify;
using cohort::launcher::Verdict;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

RendezvousSettings quick() {
  return RendezvousSettings(1, 2)
      .join_timeout(Millis(10'000))
      .last_call_timeout(Millis(300))
      .keep_alive_interval(Millis(200))
      .keep_alive_max_missed(2);
}

// Nodes "a" and "b" in round 0 of one job; returns a's round.
struct TwoNodes {
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  DynamicRendezvous a{store, "job", "a", quick()};
  DynamicRendezvous b{store, "job", "b", quick()};
  Round round;

  TwoNodes() {
    auto other = std::async(std::launch::async, [&] { return b.next_round(); });
    round = a.next_round();
    other.get();
  }
};

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

TEST(Classify, AnOwnFailureWithEveryNodePresentIsAFailureAtOnce) {
  TwoNodes job;
  ASSERT_EQ(job.round.world_size, 2);
  const auto start = Clock::now();
  EXPECT_EQ(classify(job.a, job.round, /*own=*/true, [] {}), Verdict::kFailure);
  EXPECT_LT(seconds_since(start), 0.2) << "an own failure needs no wait";
}

TEST(Classify, ANodeAlreadyGoneOutranksAFailureOfOurOwn) {
  // When a node dies, a worker here can die in a way that looks like its own (a
  // SIGPIPE, a rethrown CommError): the node's loss decides, and costs no restart.
  TwoNodes job;
  job.b.leave();
  EXPECT_EQ(classify(job.a, job.round, /*own=*/true, [] {}), Verdict::kMembership);
}

TEST(Classify, CasualtiesWaitUntilTheSilentNodeIsDropped) {
  TwoNodes job;
  job.b.keep_alive();  // b's last heartbeat
  const auto start = Clock::now();
  EXPECT_EQ(classify(job.a, job.round, /*own=*/false, [] {}), Verdict::kMembership);
  const double took = seconds_since(start);
  EXPECT_GE(took, 0.3) << "b was dropped before it missed its heartbeats";
  EXPECT_LT(took, 3.0) << "within the heartbeat bound (2.8 s)";
  EXPECT_EQ(job.a.read().participants.count("b"), 0u);
}

TEST(Classify, CasualtiesWithNoNodeLostAreAFailureAtTheBound) {
  TwoNodes job;
  auto beating = std::async(std::launch::async, [&] {
    // b stays alive and heartbeats while a decides.
    for (int i = 0; i < 40; ++i) {
      job.b.keep_alive();
      std::this_thread::sleep_for(100ms);
    }
  });
  const auto start = Clock::now();
  EXPECT_EQ(classify(job.a, job.round, /*own=*/false, [] {}), Verdict::kFailure);
  const double took = seconds_since(start);
  // The bound is keep_alive_interval * (missed + 2) + 2 s = 2.8 s.
  EXPECT_GE(took, 2.7);
  EXPECT_LT(took, 5.0);
  beating.get();
}

// Note [Failures after a node finished]: the reason to close instead of restarting.
TEST(ReasonToCloseAfterFinish, OnlyOnceANodeHasFinished) {
  using cohort::launcher::reason_to_close_after_finish;
  cohort::elastic::RendezvousState s;
  s.round = 3;
  s.participants = {{"a", 0}, {"b", 1}, {"c", 2}};
  Round r;
  r.round = 3;
  r.world_size = 3;
  r.nodes = {"a", "b", "c"};
  EXPECT_EQ(reason_to_close_after_finish(s, r, true), "") << "nobody finished: an ordinary failure restart";
  s.done = {"a"};
  EXPECT_EQ(reason_to_close_after_finish(s, r, false), "") << "everyone alive: keep waiting";
  EXPECT_NE(reason_to_close_after_finish(s, r, true).find("this node's workers failed after 1 of the round's 3"),
            std::string::npos);
  s.participants.erase("c");  // dropped for silence
  const auto why = reason_to_close_after_finish(s, r, false);
  EXPECT_NE(why.find("node c left or stopped sending heartbeats"), std::string::npos) << why;
  s.participants.erase("a");  // a finished node that left is not lost
  EXPECT_EQ(why, reason_to_close_after_finish(s, r, false));
  s.round = 4;
  EXPECT_EQ(reason_to_close_after_finish(s, r, true), "") << "another round's record";
}

}  // namespace
