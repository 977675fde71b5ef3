// ReplicaGroup with replicas as threads over one in-memory store: the groups of
// abandoned quorums are released once collective_timeout has passed (Note
// [Abandoned groups]), and the current one keeps working.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "cohort/errors.h"
#include "cohort/fault_tolerance/quorum.h"
#include "cohort/fault_tolerance/replica_group.h"

namespace ft = cohort::fault_tolerance;
using namespace std::chrono_literals;

namespace {

struct Held {
  std::int64_t after_aborts = -1, after_timeout = -1, quorums = 0;
  double sum = 0;
};

// Replica `id` of 2: three aborted steps (three regroups, each leaving a group
// behind), then a wait past collective_timeout and its grace, then one step that
// commits with an all_reduce over the current group.
Held run_replica(const c10::intrusive_ptr<c10d::Store>& store, int id) {
  auto options = ft::ReplicaGroupOptions().collective_timeout(3s).quorum_timeout(5s).start_timeout(20s);
  ft::ReplicaGroup replicas(store, store, id, 2, 0, options);
  Held held;
  for (int i = 0; i < 3; ++i) {
    replicas.begin_step();
    EXPECT_FALSE(replicas.end_step(false)) << "replica " << id << ", abort " << i;
  }
  const auto fourth = replicas.begin_step().id;  // forms the fourth quorum
  held.after_aborts = replicas.stats().groups_held;
  EXPECT_TRUE(replicas.end_step(true));
  std::this_thread::sleep_for(4200ms);  // collective_timeout (3 s) and the grace (1 s) have passed
  const auto& again = replicas.begin_step();
  held.after_timeout = replicas.stats().groups_held;
  EXPECT_EQ(again.id, fourth) << "no new quorum was needed";
  EXPECT_FALSE(again.changed);
  auto group = again.group;
  auto t = torch::full({2}, static_cast<double>(id + 1), torch::kFloat64);
  group.all_reduce(t);
  held.sum = t[0].item<double>();
  EXPECT_TRUE(replicas.end_step(true));
  held.quorums = replicas.stats().quorums;
  return held;
}

TEST(ReplicaGroup, AbandonedGroupsAreReleasedOnceTheirCollectivesCanNoLongerRun) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto a = std::async(std::launch::async, [&] { return run_replica(store, 0); });
  auto b = std::async(std::launch::async, [&] { return run_replica(store, 1); });
  for (const auto& held : {a.get(), b.get()}) {
    EXPECT_EQ(held.quorums, 4);
    // The first three quorums' groups, held while their collectives could still be
    // stuck (all three were left well within the last collective_timeout and its
    // grace, 4 s, even on a loaded machine)...
    EXPECT_EQ(held.after_aborts, 3);
    // ...and none once that has passed; the current group still reduces.
    EXPECT_EQ(held.after_timeout, 0);
    EXPECT_EQ(held.sum, 3.0);
  }
}

// Note [Forgetting committed votes]: the store does not grow with the steps. Each
// replica reports the store's key count after 5 and after 35 committed steps; both
// counts are taken between the same two barriers-by-vote, so they are comparable.
std::pair<std::int64_t, std::int64_t> keys_after_steps(const c10::intrusive_ptr<c10d::HashStore>& store, int id) {
  ft::ReplicaGroup replicas(store, store, id, 2, 0, ft::ReplicaGroupOptions().quorum_timeout(10s).start_timeout(20s));
  std::int64_t after_5 = -1;
  for (int step = 0; step < 35; ++step) {
    replicas.begin_step();
    EXPECT_TRUE(replicas.end_step(true)) << "replica " << id << ", step " << step;
    if (step == 4) after_5 = store->getNumKeys();
  }
  return {after_5, store->getNumKeys()};
}

TEST(ReplicaGroup, CommittedVotesAreForgottenSoTheStoreDoesNotGrowWithTheSteps) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto a = std::async(std::launch::async, [&] { return keys_after_steps(store, 0); });
  auto b = std::async(std::launch::async, [&] { return keys_after_steps(store, 1); });
  const auto ka = a.get(), kb = b.get();
  // 30 more steps would have left 90 more keys; the last vote and the one each
  // replica may not have forgotten yet make a difference of a few at most.
  for (const auto& [after_5, after_35] : {ka, kb}) {
    EXPECT_GT(after_5, 0);
    EXPECT_LE(after_35, after_5 + 3) << "after 5 steps: " << after_5 << " keys, after 35: " << after_35;
  }
}

// Note [One configuration]: replica 0's configuration is the job's, whichever
// replica arrives first. Replica 2, started with other settings, is refused naming
// both, and replicas 0 and 1 form quorums and commit without it.
// A HashStore that tells when someone waits on a key: "replica 2 is waiting for the
// job's configuration" is an event a test can wait for (Note [Events, not sleeps]
// in vote_quorum_test.cpp), where a sleep only made it likely.
class WatchedStore : public c10d::HashStore {
 public:
  using c10d::HashStore::wait;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& key : keys) ++waits_[key];
    }
    changed_.notify_all();
    c10d::HashStore::wait(keys, timeout);
  }
  // Whether someone began to wait on `key` within 30 s.
  bool someone_waits_on(const std::string& key) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, 30s, [&] { return waits_[key] > 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, int> waits_;
};

std::string run_configured(const c10::intrusive_ptr<c10d::Store>& store, int id, const std::string& configuration) {
  auto options = ft::ReplicaGroupOptions().quorum_timeout(5s).start_timeout(3s).configuration(configuration);
  ft::ReplicaGroup replicas(store, store, id, 3, 0, options);
  try {
    for (int step = 0; step < 3; ++step) {
      replicas.begin_step();
      EXPECT_TRUE(replicas.end_step(true)) << "replica " << id << ", step " << step;
    }
  } catch (const cohort::ConfigError& e) {
    return e.what();
  }
  return "trained";
}

TEST(ReplicaGroup, ReplicaZerosConfigurationIsTheJobsWhicheverArrivesFirst) {
  for (const bool odd_first : {true, false}) {
    SCOPED_TRACE(odd_first ? "replica 2 first" : "replica 2 last");
    auto watched = c10::make_intrusive<WatchedStore>();
    c10::intrusive_ptr<c10d::Store> store = watched;
    auto start = [&](int id, std::string configuration) {
      return std::async(std::launch::async, [store, id, configuration] { return run_configured(store, id, configuration); });
    };
    std::future<std::string> odd;
    if (odd_first) {  // replica 2 is already waiting for the configuration when replica 0 starts
      odd = start(2, "steps 30");
      ASSERT_TRUE(watched->someone_waits_on(ft::keys::configuration())) << "replica 2 never waited for it";
    }
    auto r0 = start(0, "steps 24");
    auto r1 = start(1, "steps 24");
    if (!odd_first) {  // replica 2 starts once replica 0 has published the configuration
      ASSERT_NO_THROW(store->wait({ft::keys::configuration()}, 30s));
      odd = start(2, "steps 30");
    }
    const auto refused = odd.get();
    EXPECT_NE(refused.find("replica 2 runs with configuration \"steps 30\", but replica 0, whose settings are the "
                           "job's, runs with \"steps 24\""),
              std::string::npos)
        << refused;
    EXPECT_EQ(r0.get(), "trained");
    EXPECT_EQ(r1.get(), "trained");
    // A replacement replica 0 started with other settings does not rewrite the
    // job's configuration: it is refused, naming both.
    const auto replaced = run_configured(store, 0, "steps 30");
    EXPECT_NE(replaced.find("replica 0 runs with configuration \"steps 30\", but the job was started with "
                            "\"steps 24\""),
              std::string::npos)
        << replaced;
    const auto kept = store->get(ft::keys::configuration());
    EXPECT_EQ(std::string(kept.begin(), kept.end()), "steps 24");
  }
}

}  // namespace

namespace {

// Note [Sharding inside a replica]: four ranks as two replicas of two. Every rank's
// quorum holds both replicas, its shard group is its replica's two ranks and its
// peer group the same shard of both replicas; a sum over each proves who is in it.
struct Subgroups {
  int shard = -1, replicas = -1;
  double shard_sum = 0, peer_sum = 0;
};

Subgroups run_sharded(const c10::intrusive_ptr<c10d::Store>& store, int id) {
  auto options = ft::ReplicaGroupOptions().quorum_timeout(5s).start_timeout(20s).shards_per_replica(2);
  ft::ReplicaGroup replicas(store, store, id, 4, 0, options);
  const auto& q = replicas.begin_step();
  Subgroups out;
  out.shard = q.shard;
  out.replicas = q.replicas;
  EXPECT_EQ(q.shard_group.size(), 2);
  EXPECT_EQ(q.peer_group.size(), 2);
  EXPECT_EQ(q.shard_group.rank(), q.shard);
  auto a = torch::full({1}, static_cast<double>(id), torch::kFloat64);
  auto b = a.clone();
  auto shard_group = q.shard_group;
  auto peer_group = q.peer_group;
  shard_group.all_reduce(a);
  peer_group.all_reduce(b);
  out.shard_sum = a.item<double>();
  out.peer_sum = b.item<double>();
  EXPECT_TRUE(replicas.end_step(true));
  return out;
}

}  // namespace

TEST(ReplicaGroup, ShardsPerReplicaMakesAShardGroupPerReplicaAndAPeerGroupPerShard) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::future<Subgroups>> ranks;
  for (int id = 0; id < 4; ++id)
    ranks.push_back(std::async(std::launch::async, [store, id] { return run_sharded(store, id); }));
  for (int id = 0; id < 4; ++id) {
    SCOPED_TRACE("rank " + std::to_string(id));
    const auto got = ranks[static_cast<size_t>(id)].get();
    EXPECT_EQ(got.shard, id % 2);
    EXPECT_EQ(got.replicas, 2);
    EXPECT_EQ(got.shard_sum, id < 2 ? 0 + 1 : 2 + 3);       // ranks of its replica
    EXPECT_EQ(got.peer_sum, id % 2 == 0 ? 0 + 2 : 1 + 3);   // its shard in each replica
  }
}

TEST(ReplicaGroup, ShardsPerReplicaMustDivideTheRanksAndBoundMinReplicas) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  try {
    ft::ReplicaGroup bad(store, store, 0, 3, 0, ft::ReplicaGroupOptions().shards_per_replica(2));
    FAIL() << "3 ranks were cut into replicas of 2";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("3 ranks cannot make replicas of 2 ranks each"), std::string::npos)
        << e.what();
  }
  try {
    ft::ReplicaGroup bad(store, store, 0, 4, 0, ft::ReplicaGroupOptions().shards_per_replica(2).min_replicas(3));
    FAIL() << "--min-replicas 3 of 2 replicas was taken";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--min-replicas 3 is more than the 2 replicas started"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ft::ReplicaGroupOptions().shards_per_replica(0).validate(), cohort::ConfigError);
}

namespace {

// Replica `id` of 3 trains 12 steps. Replica 2 sleeps 4 s right after it arrives
// at quorum 1 (a SIGSTOP, for a thread): the others give up on that quorum's group
// and train on without it. What replica 2 did in the end: "trained", "finished"
// (the others were done), or the error that stopped it.
std::string run_late(const c10::intrusive_ptr<c10d::Store>& store, int id) {
  auto options = ft::ReplicaGroupOptions()
                     .collective_timeout(2s)
                     .quorum_timeout(1s)
                     .start_timeout(20s)
                     .min_replicas_timeout(20s)
                     .on_event([id, slept = false](const std::string& event) mutable {
                       if (id == 2 && event == "arrived q1" && !slept) {
                         slept = true;
                         std::this_thread::sleep_for(4s);
                       }
                     });
  ft::ReplicaGroup replicas(store, store, id, 3, 0, options);
  try {
    while (replicas.step() < 12) {
      replicas.begin_step();
      std::this_thread::sleep_for(300ms);
      replicas.end_step(true);
    }
    replicas.finish();
    return "trained";
  } catch (const ft::TrainingFinished&) {
    return "finished";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

// Note [Gloo's rendezvous waits with the store's timeout]: the late replica reads
// quorum 1's addresses for at most quorum_timeout, not the store's five minutes,
// and then joins the others (or finds them finished).
TEST(ReplicaGroup, AReplicaThatResumesAfterItsQuorumWasAbandonedDoesNotHang) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::future<std::string>> replicas;
  for (int id = 0; id < 3; ++id)
    replicas.push_back(std::async(std::launch::async, [store, id] { return run_late(store, id); }));
  EXPECT_EQ(replicas[0].get(), "trained");
  EXPECT_EQ(replicas[1].get(), "trained");
  ASSERT_EQ(replicas[2].wait_for(60s), std::future_status::ready) << "the late replica hangs";
  const auto late = replicas[2].get();
  EXPECT_TRUE(late == "trained" || late == "finished") << late;
}

// Note [An event that never comes]: an agent died between numbering an event (add)
// and writing it (set). A later death of a member must still reach the watcher and
// abort the vote at once, not after quorum_timeout (60 s here; the test gives up at
// 30 s). Replica 1 forms quorum 1 with replica 0, then "dies": it never votes, and
// its death is published as event 2, after the hole at event 1.
TEST(ReplicaGroup, ADeathAfterAnEventThatNeverCameStillAbortsTheVote) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const auto options = ft::ReplicaGroupOptions().quorum_timeout(60s).collective_timeout(60s).start_timeout(20s);
  std::promise<void> survivor_formed, victim_formed, published, done;
  auto survivor = std::async(std::launch::async, [&, go = published.get_future()] {
    ft::ReplicaGroup replicas(store, store, 0, 2, 0, options);
    replicas.begin_step();
    survivor_formed.set_value();
    go.wait();
    return replicas.end_step(true);
  });
  auto victim = std::async(std::launch::async, [&, finished = done.get_future()] {
    ft::ReplicaGroup replicas(store, store, 1, 2, 0, options);
    replicas.begin_step();
    victim_formed.set_value();
    finished.wait();  // keeps its group alive, never votes
  });
  survivor_formed.get_future().wait();
  victim_formed.get_future().wait();
  EXPECT_EQ(store->add(ft::keys::events(), 1), 1);  // the agent that died before its set
  store->set(ft::keys::dead(1), std::vector<uint8_t>{'0'});
  EXPECT_EQ(store->add(ft::keys::events(), 1), 2);
  const std::string text = "dead 1 0";
  store->set(ft::keys::event(2), std::vector<uint8_t>(text.begin(), text.end()));
  published.set_value();
  const auto heard = survivor.wait_for(30s);
  done.set_value();
  ASSERT_EQ(heard, std::future_status::ready) << "the watcher waited for event 1 and never heard of the death";
  EXPECT_FALSE(survivor.get()) << "the vote with a dead member must abort";
  victim.get();
}
