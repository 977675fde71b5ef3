// The elastic rendezvous record as pure logic (Note [Rendezvous rounds]): several
// nodes driven through next_join_action/apply by hand, with explicit clocks.
#include <gtest/gtest.h>

#include "cohort/elastic/rendezvous_state.h"
#include "cohort/errors.h"

namespace {

using namespace cohort::elastic;
using std::chrono::seconds;

const Millis kFar = Millis(1'000'000'000);  // a join deadline nobody reaches

// Drives `node` until its next action is one that changes nothing (wait, finish or
// an error), as an agent's loop would; returns that action.
JoinAction join(RendezvousState& s, const std::string& node, Millis now, const RendezvousSettings& settings,
                Millis deadline = kFar) {
  for (int i = 0; i < 10; ++i) {
    const auto action = next_join_action(s, node, now, now >= deadline, settings);
    if (action == JoinAction::kWait || action == JoinAction::kFinish || action == JoinAction::kErrorTimeout ||
        action == JoinAction::kErrorClosed) {
      return action;
    }
    apply(s, action, node, now, settings);
    if (action == JoinAction::kRemoveSelf) return action;
  }
  ADD_FAILURE() << "no fixed point for " << node;
  return JoinAction::kWait;
}

TEST(RendezvousState, OneNodeCompletesAtOnce) {
  RendezvousSettings settings(1, 1);
  RendezvousState s;
  EXPECT_EQ(join(s, "a", Millis(0), settings), JoinAction::kFinish);
  EXPECT_TRUE(s.complete);
  EXPECT_EQ(s.participants.at("a"), 0);
}

TEST(RendezvousState, FullRoundCompletesWithRanksBySortedName) {
  RendezvousSettings settings(1, 3);
  RendezvousState s;
  EXPECT_EQ(join(s, "node-c", Millis(0), settings), JoinAction::kWait);  // waits for the last call
  ASSERT_TRUE(s.last_call.has_value());
  EXPECT_EQ(*s.last_call, Millis(0) + seconds(30));
  EXPECT_EQ(join(s, "node-a", Millis(100), settings), JoinAction::kWait);
  EXPECT_EQ(join(s, "node-b", Millis(200), settings), JoinAction::kFinish);  // the third fills the round
  EXPECT_TRUE(s.complete);
  EXPECT_FALSE(s.last_call.has_value());
  EXPECT_EQ(s.participants, (std::map<std::string, int>{{"node-a", 0}, {"node-b", 1}, {"node-c", 2}}));
  EXPECT_EQ(join(s, "node-c", Millis(300), settings), JoinAction::kFinish);
}

TEST(RendezvousState, LastCallCompletesWithWhoeverIsThere) {
  RendezvousSettings settings = RendezvousSettings(2, 4).last_call_timeout(seconds(10));
  RendezvousState s;
  EXPECT_EQ(join(s, "a", Millis(0), settings), JoinAction::kWait);
  EXPECT_FALSE(s.last_call.has_value());  // fewer than MIN: no last call yet
  EXPECT_EQ(join(s, "b", Millis(5'000), settings), JoinAction::kWait);
  EXPECT_EQ(*s.last_call, Millis(15'000));
  EXPECT_EQ(join(s, "a", Millis(14'999), settings), JoinAction::kWait);
  EXPECT_EQ(join(s, "a", Millis(15'000), settings), JoinAction::kFinish);
  EXPECT_EQ(s.participants.size(), 2u);
}

TEST(RendezvousState, TooFewNodesTimeOutAndLeaveNoTrace) {
  RendezvousSettings settings(2, 2);
  RendezvousState s;
  EXPECT_EQ(join(s, "a", Millis(0), settings, Millis(1'000)), JoinAction::kWait);
  EXPECT_EQ(join(s, "a", Millis(1'000), settings, Millis(1'000)), JoinAction::kRemoveSelf);
  EXPECT_TRUE(s.participants.empty());
  EXPECT_TRUE(s.heartbeats.empty());
  EXPECT_EQ(next_join_action(s, "a", Millis(1'000), /*join_expired=*/true, settings), JoinAction::kErrorTimeout);
}

TEST(RendezvousState, LateNodeWaitsThenJoinsTheNextRound) {
  RendezvousSettings settings(1, 3);
  RendezvousState s;
  join(s, "a", Millis(0), settings);
  join(s, "b", Millis(0), settings);
  apply(s, JoinAction::kMarkComplete, "a", Millis(30'000), settings);
  ASSERT_TRUE(s.complete);
  EXPECT_EQ(join(s, "c", Millis(40'000), settings), JoinAction::kWait);
  EXPECT_EQ(s.wait_list, (std::set<std::string>{"c"}));
  EXPECT_EQ(nodes_waiting(s), 1);  // the running agents restart to take c in
  // They leave the finished round; the last one out opens the next.
  leave(s, "a", settings);
  EXPECT_TRUE(s.complete);
  EXPECT_EQ(s.round, 0);
  leave(s, "b", settings);
  EXPECT_FALSE(s.complete);
  EXPECT_EQ(s.round, 1);
  for (const char* node : {"a", "b", "c"}) join(s, node, Millis(41'000), settings);
  EXPECT_TRUE(s.complete);  // three of three: complete at once
  EXPECT_TRUE(s.wait_list.empty());
  EXPECT_EQ(s.participants, (std::map<std::string, int>{{"a", 0}, {"b", 1}, {"c", 2}}));
}

TEST(RendezvousState, NoRoomMeansNoWaitList) {
  RendezvousSettings settings(1, 2);
  RendezvousState s;
  join(s, "a", Millis(0), settings);
  join(s, "b", Millis(0), settings);
  ASSERT_TRUE(s.complete);
  EXPECT_EQ(join(s, "c", Millis(1), settings), JoinAction::kWait);
  EXPECT_TRUE(s.wait_list.empty());  // the job is at MAX: c would never get in
}

TEST(RendezvousState, DeadNodesAreDroppedAndTheRoundGoesOn) {
  RendezvousSettings settings = RendezvousSettings(1, 2).keep_alive_interval(seconds(5)).keep_alive_max_missed(3);
  RendezvousState s;
  join(s, "a", Millis(0), settings);
  join(s, "b", Millis(0), settings);
  ASSERT_TRUE(s.complete);
  // a's watch, on a's own monotonic clock; a beats, b has gone silent.
  HeartbeatWatch watch;
  EXPECT_TRUE(drop_dead_nodes(s, watch, Millis(100'000), settings).empty());
  for (const auto t : {105'000, 110'000, 114'000}) {  // looks no further apart than two beats
    heartbeat(s, "a");
    EXPECT_TRUE(drop_dead_nodes(s, watch, Millis(t), settings).empty());
  }
  heartbeat(s, "a");
  EXPECT_TRUE(drop_dead_nodes(s, watch, Millis(115'000), settings).empty());  // exactly at the bound: alive
  const auto dead = drop_dead_nodes(s, watch, Millis(115'001), settings);
  EXPECT_EQ(dead, (std::vector<std::string>{"b"}));
  EXPECT_EQ(s.participants.count("b"), 0u);
  EXPECT_TRUE(s.complete);  // a still runs; it restarts when its workers fail
  leave(s, "a", settings);
  EXPECT_EQ(s.round, 1);
  EXPECT_EQ(join(s, "a", Millis(16'000), settings), JoinAction::kWait);  // MIN 1: last call
}

// Note [Heartbeats without clocks]: a heartbeat is a number, aged on the observer's
// own monotonic clock, so neither hosts' clocks nor a step of one can drop a live node.
TEST(HeartbeatWatch, ALiveNodeIsNeverDroppedWhateverTheWallClocksSay) {
  RendezvousSettings settings = RendezvousSettings(2, 2).keep_alive_interval(seconds(1)).keep_alive_max_missed(3);
  RendezvousState s;
  // b's wall clock is 30 s ahead of a's; the last call and the round do not care.
  join(s, "a", Millis(1'000'000), settings);
  join(s, "b", Millis(1'030'000), settings);
  ASSERT_TRUE(s.complete);
  HeartbeatWatch watch;  // a's
  for (int t = 0; t < 60; ++t) {
    heartbeat(s, "b");
    heartbeat(s, "a");
    EXPECT_TRUE(drop_dead_nodes(s, watch, Millis(5'000 + t * 1'000), settings).empty()) << "at " << t << " s";
  }
  EXPECT_EQ(s.participants.size(), 2u);
  // What a beat holds is a number from the record's own sequence, never a time.
  EXPECT_EQ(s.heartbeats.at("a"), s.beats);
  EXPECT_LT(s.heartbeats.at("b"), s.beats);
}

TEST(HeartbeatWatch, SilenceIsTimedFromWhenThisObserverLastSawABeatChange) {
  const Millis bound(3'000);
  RendezvousState s;
  s.participants = {{"a", 0}, {"b", 1}};
  heartbeat(s, "a");
  heartbeat(s, "b");
  HeartbeatWatch watch;
  watch.observe(s, Millis(50'000));  // first look: everyone gets a full bound from now
  EXPECT_TRUE(watch.silent(Millis(53'000), bound).empty());
  heartbeat(s, "a");
  watch.observe(s, Millis(52'000));
  EXPECT_EQ(watch.silent(Millis(53'001), bound), (std::vector<std::string>{"b"}));
  EXPECT_TRUE(watch.silent(Millis(55'000), bound).size() == 1u) << "a beat at 52 s: alive until 55 s";
  EXPECT_EQ(watch.silent(Millis(55'001), bound), (std::vector<std::string>{"a", "b"}));
}

// Note [A blind observer]: an observer that could not read the store for 5 s (etcd
// out) under a 6 s bound, beats 2 s apart, drops nobody when it reads again, but a
// peer that stays silent afterwards is dropped a bound after the gap.
TEST(HeartbeatWatch, TheTimeAnObserverCouldNotReadCountsAgainstNobody) {
  RendezvousSettings settings = RendezvousSettings(1, 2).keep_alive_interval(seconds(2)).keep_alive_max_missed(3);
  RendezvousState s;
  join(s, "a", Millis(0), settings);
  join(s, "b", Millis(0), settings);
  ASSERT_TRUE(s.complete);
  HeartbeatWatch watch;  // a's
  for (const auto t : {0, 2'000, 4'000}) {
    heartbeat(s, "a");
    heartbeat(s, "b");
    ASSERT_TRUE(drop_dead_nodes(s, watch, Millis(t), settings).empty());
  }
  // a could not read from 4 s to 9 s; b's beats in that time were written but b's
  // last one before the outage is what a sees (b is itself blocked on the store).
  heartbeat(s, "a");
  EXPECT_TRUE(drop_dead_nodes(s, watch, Millis(9'000), settings).empty()) << "5 s blind: nobody is dropped";
  EXPECT_TRUE(drop_dead_nodes(s, watch, Millis(10'500), settings).empty());
  heartbeat(s, "a");
  EXPECT_TRUE(drop_dead_nodes(s, watch, Millis(12'000), settings).empty());
  heartbeat(s, "a");
  EXPECT_TRUE(drop_dead_nodes(s, watch, Millis(14'000), settings).empty()) << "b silent for 5 s since a could read again";
  heartbeat(s, "a");
  EXPECT_EQ(drop_dead_nodes(s, watch, Millis(15'500), settings), (std::vector<std::string>{"b"}))
      << "b silent for more than the bound since a could read again";
}

TEST(HeartbeatWatch, ANodeThatLeftAndCameBackIsNew) {
  RendezvousSettings settings = RendezvousSettings(1, 2).keep_alive_interval(seconds(1)).keep_alive_max_missed(2);
  RendezvousState s;
  join(s, "a", Millis(0), settings);
  HeartbeatWatch watch;
  watch.observe(s, Millis(0));
  const auto first = s.heartbeats.at("a");
  leave(s, "a", settings);
  EXPECT_TRUE(s.heartbeats.empty());
  join(s, "a", Millis(10'000), settings);
  EXPECT_NE(s.heartbeats.at("a"), first) << "beat numbers are never reused";
  EXPECT_TRUE(drop_dead_nodes(s, watch, Millis(10'000), settings).empty()) << "its new beat was seen now";
}

TEST(RendezvousState, ADepartureBelowMinCancelsTheLastCall) {
  RendezvousSettings settings(2, 3);
  RendezvousState s;
  join(s, "a", Millis(0), settings);
  join(s, "b", Millis(0), settings);
  ASSERT_TRUE(s.last_call.has_value());
  leave(s, "b", settings);
  EXPECT_FALSE(s.last_call.has_value());
  EXPECT_EQ(join(s, "a", Millis(60'000), settings), JoinAction::kWait);  // never completes alone
}

TEST(RendezvousState, AClosedRendezvousRefusesEveryone) {
  RendezvousSettings settings(1, 2);
  RendezvousState s;
  join(s, "a", Millis(0), settings);
  s.closed = true;
  EXPECT_EQ(next_join_action(s, "a", Millis(1), false, settings), JoinAction::kErrorClosed);
  EXPECT_EQ(next_join_action(s, "z", Millis(1), false, settings), JoinAction::kErrorClosed);
}

TEST(RendezvousState, AFailedRoundCountsOnceAndTheCountSurvivesRejoining) {
  RendezvousSettings settings(1, 2);
  RendezvousState s;
  adopt_max_restarts(s, 2);
  join(s, "a", Millis(0), settings);
  join(s, "b", Millis(0), settings);
  // Both nodes report round 0's failure: one restart.
  EXPECT_TRUE(count_failure(s, 0));
  EXPECT_TRUE(count_failure(s, 0));
  EXPECT_EQ(s.restarts, 1);
  leave(s, "a", settings);
  leave(s, "b", settings);
  ASSERT_EQ(s.round, 1);
  // A node that leaves and joins again finds the count where it was (pytorch#147064).
  join(s, "b", Millis(1), settings);
  join(s, "a", Millis(1), settings);
  EXPECT_TRUE(count_failure(s, 1));
  EXPECT_EQ(s.restarts, 2);
  leave(s, "a", settings);
  leave(s, "b", settings);
  join(s, "a", Millis(2), settings);
  EXPECT_FALSE(count_failure(s, 2)) << "the third failure exceeds --max-restarts 2";
  EXPECT_EQ(s.restarts, 2);
  RendezvousState unset;
  EXPECT_FALSE(count_failure(unset, 0)) << "no limit adopted yet allows no restart";
}

// The limit is the job's: the first agent fixes it, and one that rejoins with a
// larger --max-restarts cannot extend the budget.
TEST(RendezvousState, TheRestartLimitIsTheFirstAgentsForTheWholeJob) {
  RendezvousSettings settings(1, 2);
  RendezvousState s;
  EXPECT_EQ(adopt_max_restarts(s, 1), 1);
  EXPECT_EQ(adopt_max_restarts(s, 5), 1) << "a later agent follows the job's limit";
  join(s, "a", Millis(0), settings);
  EXPECT_TRUE(count_failure(s, 0));
  leave(s, "a", settings);
  join(s, "a", Millis(1), settings);
  EXPECT_FALSE(count_failure(s, 1)) << "the job's limit of 1 holds against an agent's 5";
  EXPECT_EQ(s.restarts, 1);
  EXPECT_EQ(decode(encode(s)).max_restarts, 1);
}

// Note [Rendezvous rounds]: the job's --nnodes, like its --max-restarts, is the
// first agent's; the caller refuses an agent with another.
TEST(RendezvousState, TheNodeRangeIsTheFirstAgentsForTheWholeJob) {
  RendezvousState s;
  EXPECT_EQ(adopt_nnodes(s, 1, 2), std::make_pair(1, 2));
  EXPECT_EQ(adopt_nnodes(s, 2, 2), std::make_pair(1, 2)) << "a later agent finds the job's range";
  EXPECT_EQ(adopt_nnodes(s, 1, 3), std::make_pair(1, 2));
  EXPECT_EQ(s.min_nodes, 1);
  EXPECT_EQ(s.max_nodes, 2);
  const auto back = decode(encode(s));
  EXPECT_EQ(back.min_nodes, 1);
  EXPECT_EQ(back.max_nodes, 2);
  EXPECT_EQ(nnodes_text(2, 2), "2");
  EXPECT_EQ(nnodes_text(1, 4), "1:4");
}

// Note [Held rounds]: a complete held round keeps its slots. A node dropped for
// silence leaves its slot vacant and the round goes on; a newcomer takes the lowest
// vacant slot, keeping that slot's rank; with none vacant it waits as a spare.
TEST(RendezvousState, AHeldRoundKeepsItsSlotsAndANewcomerTakesAVacantOne) {
  RendezvousSettings settings = RendezvousSettings(1, 3).keep_alive_interval(seconds(1)).keep_alive_max_missed(2);
  RendezvousState s;
  EXPECT_TRUE(adopt_held(s, true));
  adopt_nnodes(s, 1, 3);
  for (const char* node : {"c", "a", "b"}) join(s, node, Millis(0), settings);
  ASSERT_TRUE(s.complete);
  EXPECT_EQ(s.slots, 3);
  EXPECT_EQ(vacant_slot(s), -1);
  // No room: a spare waits without a place on the list (the round is at MAX).
  EXPECT_EQ(join(s, "d", Millis(1), settings), JoinAction::kWait);
  HeartbeatWatch watch;
  drop_dead_nodes(s, watch, Millis(0), settings);
  heartbeat(s, "a");
  heartbeat(s, "c");
  drop_dead_nodes(s, watch, Millis(1'000), settings);  // a look per beat (Note [A blind observer])
  heartbeat(s, "a");
  heartbeat(s, "c");
  EXPECT_EQ(drop_dead_nodes(s, watch, Millis(2'001), settings), (std::vector<std::string>{"b"}));
  EXPECT_TRUE(s.complete) << "a held round is not ended by a lost node";
  EXPECT_EQ(s.round, 0);
  EXPECT_EQ(s.participants, (std::map<std::string, int>{{"a", 0}, {"c", 2}}));
  EXPECT_EQ(vacant_slot(s), 1);
  // The survivors' own round is unchanged; the spare takes b's slot, rank and all.
  EXPECT_EQ(join(s, "a", Millis(3'000), settings), JoinAction::kFinish);
  EXPECT_EQ(join(s, "d", Millis(3'000), settings), JoinAction::kFinish);
  EXPECT_EQ(s.participants.at("d"), 1);
  EXPECT_EQ(s.slots, 3);
  EXPECT_EQ(vacant_slot(s), -1);
  EXPECT_EQ(decode(encode(s)), s);
  // Two vacant slots: the lowest goes first.
  leave(s, "c", settings);
  leave(s, "a", settings);
  EXPECT_EQ(vacant_slot(s), 0);
  EXPECT_EQ(join(s, "e", Millis(4'000), settings), JoinAction::kFinish);
  EXPECT_EQ(s.participants.at("e"), 0);
  EXPECT_EQ(vacant_slot(s), 2);
  // Once a node has finished, a vacant slot is not taken: the job is ending.
  s.done.insert("d");
  EXPECT_EQ(join(s, "f", Millis(5'000), settings), JoinAction::kWait);
  EXPECT_EQ(s.participants.count("f"), 0u);
  // When every node has left, the next round forms afresh, still held.
  leave(s, "d", settings);
  leave(s, "e", settings);
  EXPECT_EQ(s.round, 1);
  EXPECT_FALSE(s.complete);
  EXPECT_EQ(s.slots, 0);
  EXPECT_TRUE(s.held);
}

TEST(RendezvousState, HoldingIsTheFirstAgentsForTheWholeJob) {
  RendezvousState s;
  EXPECT_FALSE(adopt_held(s, false));
  adopt_nnodes(s, 1, 2);
  EXPECT_FALSE(adopt_held(s, true)) << "a later agent finds the job's mode";
  RendezvousState t;
  EXPECT_TRUE(adopt_held(t, true));
  adopt_nnodes(t, 1, 2);
  EXPECT_TRUE(adopt_held(t, false));
  // Without holding, a lost node's slot is never handed out.
  RendezvousSettings settings(1, 2);
  join(s, "a", Millis(0), settings);
  join(s, "b", Millis(0), settings);
  ASSERT_TRUE(s.complete);
  leave(s, "b", settings);
  EXPECT_EQ(vacant_slot(s), -1);
  EXPECT_EQ(join(s, "c", Millis(1), settings), JoinAction::kWait);
  EXPECT_EQ(s.wait_list, (std::set<std::string>{"c"}));
}

TEST(RendezvousState, RecordRoundTripsAndRejectsStrangers) {
  RendezvousSettings settings(1, 3);
  RendezvousState s;
  join(s, "a", Millis(5), settings);
  s.restarts = 2;
  s.max_restarts = 3;
  s.failed_round = 1;
  const auto back = decode(encode(s));
  EXPECT_EQ(back, s);
  ASSERT_TRUE(back.last_call.has_value());
  join(s, "b", Millis(6), settings);
  join(s, "c", Millis(7), settings);
  EXPECT_EQ(decode(encode(s)), s);
  EXPECT_THROW(decode("not json"), cohort::DataError);
  EXPECT_THROW(decode(R"({"round": 1})"), cohort::DataError);
  // Note [Integers from JSON]: a record whose numbers are floats or too wide for their
  // fields is a stranger's too, not undefined behaviour or a truncated slot.
  const std::string good = encode(s);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const auto at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from << " in " << text;
    return at == std::string::npos ? text : text.replace(at, from.size(), to);
  };
  EXPECT_THROW(decode(with("\"round\":", "\"round\":2e72,\"x\":")), cohort::DataError);
  EXPECT_THROW(decode(with("\"slots\":", "\"slots\":4294967296,\"x\":")), cohort::DataError);
  EXPECT_THROW(decode(with("\"a\":", "\"a\":1.5,\"x\":")), cohort::DataError);
}

TEST(RendezvousConf, ParsesTorchrunKeysInSeconds) {
  auto s = parse_rdzv_conf("join_timeout=900,last_call_timeout=1.5,close_timeout=10,keep_alive_interval=2,"
                           "keep_alive_max_heartbeats=4",
                           RendezvousSettings(1, 2));
  EXPECT_EQ(s.join_timeout(), Millis(900'000));
  EXPECT_EQ(s.last_call_timeout(), Millis(1'500));
  EXPECT_EQ(s.close_timeout(), Millis(10'000));
  EXPECT_EQ(s.keep_alive_interval(), Millis(2'000));
  EXPECT_EQ(s.keep_alive_max_missed(), 4);
  EXPECT_EQ(parse_rdzv_conf("", RendezvousSettings(1, 2)).join_timeout(), Millis(600'000));
  EXPECT_EQ(s.worker_store(), cohort::elastic::WorkerStore::kCohort);
  EXPECT_EQ(parse_rdzv_conf("worker_store=tcpstore", RendezvousSettings(1, 2)).worker_store(),
            cohort::elastic::WorkerStore::kTcpStore);
  EXPECT_EQ(cohort::elastic::rdzv_conf_keys("join_timeout=1,,worker_store=cohort"),
            (std::vector<std::string>{"join_timeout", "worker_store"}));
}

TEST(RendezvousConf, BadValuesNameTheKey) {
  auto message = [](const std::string& conf) {
    try {
      parse_rdzv_conf(conf, RendezvousSettings(1, 2));
    } catch (const cohort::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("join_timeout=0").find("join_timeout=0: must be positive"), std::string::npos);
  EXPECT_NE(message("last_call_timeout=-3").find("last_call_timeout=-3: must be positive"), std::string::npos);
  EXPECT_NE(message("close_timeout=soon").find("close_timeout=soon: not a number"), std::string::npos);
  EXPECT_NE(message("keep_alive_max_heartbeats=0").find("keep_alive_max_heartbeats=0"), std::string::npos);
  EXPECT_NE(message("timeout=5").find("unknown key 'timeout'"), std::string::npos);
  EXPECT_NE(message("join_timeout").find("KEY=VALUE"), std::string::npos);
  // Note [rdzv-conf ranges]: nothing infinite, nothing that rounds to 0 ms.
  EXPECT_NE(message("join_timeout=inf").find("join_timeout=inf: at most a week"), std::string::npos);
  EXPECT_NE(message("join_timeout=1e300").find("join_timeout=1e300: at most a week"), std::string::npos);
  EXPECT_NE(message("close_timeout=nan").find("close_timeout=nan: must be positive"), std::string::npos);
  EXPECT_NE(message("keep_alive_interval=0.0001").find("keep_alive_interval=0.0001: at least 0.1 s"),
            std::string::npos);
  EXPECT_NE(message("keep_alive_interval=0.001").find("at least 0.1 s"), std::string::npos);
  EXPECT_EQ(parse_rdzv_conf("keep_alive_interval=0.1", RendezvousSettings(1, 2)).keep_alive_interval(), Millis(100));
  EXPECT_EQ(parse_rdzv_conf("last_call_timeout=0.0001", RendezvousSettings(1, 2)).last_call_timeout(), Millis(1));
  EXPECT_EQ(parse_rdzv_conf("join_timeout=604800", RendezvousSettings(1, 2)).join_timeout(), Millis(604'800'000));
}

}  // namespace
