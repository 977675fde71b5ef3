// Ranks as threads over one in-memory store: exact collectives, sub-groups, and the
// diagnosis a timeout gives. Fast enough to run many world sizes.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/torch.h>

#include <future>
#include <limits>
#include <thread>

#include "cohort/comm/world.h"
#include "cohort/errors.h"
#include "support/thread_world.h"

namespace {
using cohort::comm::InitOptions;
using cohort::comm::World;
using namespace std::chrono_literals;

// Ranks as threads over one HashStore, with the options a test gives.
template <typename Body>
void run_ranks(int n, InitOptions options, Body body) {
  cohort::testing::run_thread_world(n, body, options);
}

InitOptions quick() { return InitOptions().backend("gloo").timeout(20s).join_timeout(20s); }

// Note [Checked collectives]: ranks calling collectives of different sizes get a
// ConfigError naming each rank's call, where Gloo alone aborts the process from its
// transport thread (EnforceNotMet, exit 134: ../shared/repro/amp-dp-ddp #5).
TEST(CheckedCollectives, DifferentSizesAreAnErrorNamingEachRanksCallNotAnAbort) {
  run_ranks(2, quick().check_collectives(true), [](World& world) {
    auto& g = world.group();
    auto same = torch::ones({3});
    g.all_reduce(same);  // matched calls pass the check
    EXPECT_TRUE(torch::equal(same, torch::full({3}, 2.0f)));
    auto t = torch::ones({world.rank() == 0 ? 4 : 21});
    try {
      g.all_reduce(t);
      ADD_FAILURE() << "expected the different sizes to be refused";
    } catch (const cohort::ConfigError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("rank 0: all_reduce of 16 bytes, rank 1: all_reduce of 84 bytes"), std::string::npos) << what;
    }
    g.barrier();  // the group is still usable
  });
  EXPECT_TRUE(InitOptions::from_env({{"COHORT_CHECK_COLLECTIVES", "1"}}).check_collectives());
}

class ThreadWorlds : public ::testing::TestWithParam<int> {};

TEST_P(ThreadWorlds, AllReduceBroadcastGatherScatterAreExact) {
  const int n = GetParam();
  run_ranks(n, quick(), [n](World& world) {
    auto& g = world.group();
    const int r = g.rank();
    auto t = torch::full({3}, static_cast<float>(r + 1));
    g.all_reduce(t);
    EXPECT_TRUE(torch::equal(t, torch::full({3}, n * (n + 1) / 2.0f)));
    auto b = r == 0 ? torch::tensor({1, 2, 3}, torch::kInt64) : torch::zeros({3}, torch::kInt64);
    g.broadcast(b, 0);
    EXPECT_TRUE(torch::equal(b, torch::tensor({1, 2, 3}, torch::kInt64)));
    auto parts = g.all_gather(torch::full({2}, static_cast<double>(r), torch::kFloat64));
    ASSERT_EQ(static_cast<int>(parts.size()), n);
    for (int i = 0; i < n; ++i) EXPECT_EQ(parts[i][1].item<double>(), i);
    auto mine = g.reduce_scatter(torch::ones({n * 2}));
    EXPECT_TRUE(torch::equal(mine, torch::full({2}, static_cast<float>(n))));
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, ThreadWorlds, ::testing::Values(1, 2, 3, 4));

TEST(ThreadWorld, SubGroupsAreIndependent) {
  run_ranks(4, quick(), [](World& world) {
    auto low = world.new_group({0, 1});
    auto high = world.new_group({3, 2});  // group rank follows the order given
    auto& mine = world.rank() < 2 ? low : high;
    EXPECT_FALSE((world.rank() < 2 ? high : low).is_member());
    auto t = torch::full({1}, static_cast<double>(world.rank()));
    mine.all_reduce(t);
    EXPECT_EQ(t.item<double>(), world.rank() < 2 ? 1.0 : 5.0);
    if (world.rank() == 3) {
      EXPECT_EQ(high.rank(), 0);
    }
  });
}

TEST(ThreadWorld, NonMemberUseIsAClearError) {
  run_ranks(2, quick(), [](World& world) {
    auto g = world.new_group({0});
    if (world.rank() == 1) {
      auto t = torch::ones({1});
      EXPECT_THROW(g.all_reduce(t), cohort::ConfigError);
    }
  });
}

TEST(ThreadWorld, BadArgumentsAreNamed) {
  run_ranks(2, quick(), [](World& world) {
    auto& g = world.group();
    auto t = torch::ones({4, 4}).t();
    EXPECT_THROW(g.all_reduce(t), cohort::ConfigError);  // not contiguous
    auto i = torch::ones({2}, torch::kInt64);
    EXPECT_THROW(g.all_reduce(i, cohort::comm::ReduceOp::kAvg), cohort::ConfigError);
    auto odd = torch::ones({3});
    EXPECT_THROW(g.reduce_scatter(odd), cohort::ConfigError);
    EXPECT_THROW(g.send(torch::ones({1}), g.rank()), cohort::ConfigError);
    EXPECT_THROW(world.new_group({0, 0}), cohort::ConfigError);
  });
}

TEST(ThreadWorld, TimeoutNamesTheRankThatDidNotArrive) {
  auto options = quick().timeout(3s).heartbeat_interval(500ms);
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::promise<void> release;
  auto released = release.get_future().share();
  // Ranks 0 and 1 keep their worlds until both have their verdict: the first to
  // tear down would otherwise close the other's connections mid-wait.
  std::atomic<int> verdicts{0};
  std::vector<std::future<std::string>> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.push_back(std::async(std::launch::async, [=, &verdicts]() -> std::string {
      auto world = World::init_with_store(store, r, 3, options);
      world.group().barrier();
      if (r == 2) {
        released.wait();  // rank 2 never enters the all_reduce
        return "";
      }
      auto t = torch::ones({1});
      std::string verdict = "no timeout";
      try {
        world.group().all_reduce(t);
      } catch (const cohort::TimeoutError& e) {
        EXPECT_EQ(e.missing_ranks(), std::vector<int>{2});
        EXPECT_EQ(e.operation(), "all_reduce");
        verdict = e.what();
      } catch (const std::exception& e) {
        verdict = std::string("other error: ") + e.what();
      }
      ++verdicts;
      while (verdicts.load() < 2) std::this_thread::yield();
      return verdict;
    }));
  auto m0 = ranks[0].get();
  auto m1 = ranks[1].get();
  release.set_value();
  ranks[2].get();
  // Ranks 0 and 1 both wait 3 s. Gloo closes the pairs of a wait that timed out, so
  // when one rank's deadline comes well before the other's (a loaded machine: this
  // stop's CI run), the other sees its connection closed instead. So at least one
  // names the missing rank, and each other one reports the closed connection.
  int named = 0;
  for (const auto& m : {m0, m1}) {
    if (m.find("timed out after 3.0 s in all_reduce #2") != std::string::npos) {
      EXPECT_NE(m.find("rank 2 (alive, but still at barrier #1)"), std::string::npos) << m;
      ++named;
    } else {
      EXPECT_NE(m.find("a peer closed its connection"), std::string::npos) << m;
    }
  }
  EXPECT_GE(named, 1) << m0 << "\n" << m1;
}

// Rank 0 waits in a broadcast while rank 1 waits in an all_reduce, both their
// collective #2, rank r for timeouts[r]. Returns each rank's error message, with
// "other error: " before one that is not a TimeoutError.
std::vector<std::string> different_collectives(std::vector<std::chrono::milliseconds> timeouts) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::atomic<int> verdicts{0};
  std::vector<std::future<std::string>> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(std::async(std::launch::async, [=, &verdicts]() -> std::string {
      auto options = quick().timeout(timeouts[static_cast<size_t>(r)]).heartbeat_interval(500ms);
      auto world = World::init_with_store(store, r, 2, options);
      world.group().barrier();
      auto t = torch::ones({1});
      std::string verdict = "no timeout";
      try {
        if (r == 0) world.group().broadcast(t, /*root=*/1);  // waits to receive from rank 1
        else world.group().all_reduce(t);
      } catch (const cohort::TimeoutError& e) {
        EXPECT_EQ(e.missing_ranks(), std::vector<int>{1 - r});
        verdict = e.what();
      } catch (const std::exception& e) {
        verdict = std::string("other error: ") + e.what();
      }
      ++verdicts;  // keep both worlds until both have their verdict
      while (verdicts.load() < 2) std::this_thread::yield();
      return verdict;
    }));
  std::vector<std::string> out;
  for (auto& f : ranks) out.push_back(f.get());
  return out;
}

// Every rank arrived, so the diagnosis must name the two collectives, not blame the
// network. Both wait 3 s, but the first to give up closes its connections (Gloo
// does), and the other may see that just before its own deadline (stop 52's
// red CI): either way its error names the collectives (Note [A peer that gave up
// first]).
TEST(ThreadWorld, TimeoutInDifferentCollectivesNamesBoth) {
  auto m = different_collectives({3s, 3s});
  EXPECT_NE(m[0].find("ranks called different collectives: rank 0 in broadcast #2, rank 1 in all_reduce #2"),
            std::string::npos) << m[0];
  EXPECT_NE(m[1].find("ranks called different collectives: rank 1 in all_reduce #2, rank 0 in broadcast #2"),
            std::string::npos) << m[1];
  for (const auto& msg : m) {
    EXPECT_EQ(msg.find("transport stalled"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("a peer closed its connection"), std::string::npos) << msg;
  }
}

// The race above made certain: rank 0 gives up after 1 s, long before rank 1's 8 s.
// Gloo closes rank 0's connections as it gives up, so rank 1's wait ends then, and it must still name the collectives rather than report a crash.
TEST(ThreadWorld, APeerThatGaveUpFirstLeavesTheOtherTheDiagnosisNotACrash) {
  auto m = different_collectives({1s, 8s});
  EXPECT_NE(m[0].find("timed out after 1.0 s in broadcast #2"), std::string::npos) << m[0];
  EXPECT_NE(m[1].find("ranks called different collectives: rank 1 in all_reduce #2, rank 0 in broadcast #2"),
            std::string::npos) << m[1];
  EXPECT_EQ(m[1].find("a peer closed its connection"), std::string::npos) << m[1];
}

TEST(ThreadWorld, JoinTimeoutNamesMissingRanks) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  try {
    World::init_with_store(store, 0, 3, quick().join_timeout(500ms));
    ADD_FAILURE() << "joined a world whose other ranks never came";
  } catch (const cohort::TimeoutError& e) {
    EXPECT_EQ(e.missing_ranks(), (std::vector<int>{1, 2}));
    EXPECT_NE(std::string(e.what()).find("missing: ranks 1, 2"), std::string::npos) << e.what();
  }
}

// A store whose waits on the backend's address exchange answer late: the rank that
// uses it builds its Gloo mesh last.
class LateMeshStore : public c10d::PrefixStore {
 public:
  LateMeshStore(c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds delay)
      : c10d::PrefixStore("threads", std::move(store)), delay_(delay) {}
  void wait(const std::vector<std::string>& keys) override {
    hold(keys);
    c10d::PrefixStore::wait(keys);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    hold(keys);
    c10d::PrefixStore::wait(keys, timeout);
  }

 private:
  void hold(const std::vector<std::string>& keys) const {
    for (const auto& k : keys)
      if (k.find("/backend/") != std::string::npos) {
        std::this_thread::sleep_for(delay_);
        return;
      }
  }
  std::chrono::milliseconds delay_;
};

// Note [A group is made when every member is connected]: ranks that fail at once
// after init (here all but one, refusing their model) leave the slow one its own
// error, not Gloo's "Connection closed by peer" from the middle of its set-up; and
// no rank's init returns before the slow one's backend is built.
TEST(ThreadWorld, RanksThatFailRightAfterInitLeaveASlowPeerItsOwnError) {
  constexpr int kRanks = 4, kSlow = 3;
  constexpr auto kDelay = 300ms;
  auto hash = c10::make_intrusive<c10d::HashStore>();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::future<double>> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.push_back(std::async(std::launch::async, [=]() -> double {
      c10::intrusive_ptr<c10d::Store> store;
      if (r == kSlow)
        store = c10::make_intrusive<LateMeshStore>(hash, kDelay);
      else
        store = c10::make_intrusive<c10d::PrefixStore>("threads", hash);
      auto world = World::init_with_store(store, r, kRanks, quick());
      const double returned = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return returned;  // leaves at once, as a rank refusing its model would: its sockets close
    }));
  std::vector<double> returned;
  for (int r = 0; r < kRanks; ++r) {
    try {
      returned.push_back(ranks[static_cast<size_t>(r)].get());
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " did not get past init: " << e.what();
      returned.push_back(std::numeric_limits<double>::infinity());
    }
  }
  // The slow rank's Gloo set-up waits kDelay at least once, so it cannot be built
  // before then; no rank may have gone on before it was.
  const double slow_built_at_least = std::chrono::duration<double>(kDelay).count();
  for (int r = 0; r < kRanks; ++r)
    EXPECT_GE(returned[static_cast<size_t>(r)], slow_built_at_least)
        << "rank " << r << "'s init returned before rank " << kSlow << "'s backend could be built";
}

TEST(SingleProcess, WorldOfOneNeedsNoNetwork) {
  auto world = World::init(cohort::comm::WorldInfo{}, quick());
  EXPECT_EQ(world.size(), 1);
  auto t = torch::full({2}, 3.0);
  world.group().all_reduce(t);
  EXPECT_TRUE(torch::equal(t, torch::full({2}, 3.0)));
  EXPECT_EQ(world.device(), c10::Device(c10::kCPU));
}

// Note [SIGPIPE in workers]: a rank writing to a dead peer's connection must see
// EPIPE (and throw CommError), not be killed by SIGPIPE.
TEST(SingleProcess, InitIgnoresSigpipeUnlessTheProgramChoseOtherwise) {
  struct sigaction before {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &before), 0);
  signal(SIGPIPE, SIG_DFL);
  World::init(cohort::comm::WorldInfo{}, quick());
  struct sigaction now {};
  sigaction(SIGPIPE, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
  // A handler of the program's own stays.
  auto handler = +[](int) {};
  signal(SIGPIPE, handler);
  World::init(cohort::comm::WorldInfo{}, quick());
  sigaction(SIGPIPE, nullptr, &now);
  EXPECT_EQ(now.sa_handler, handler);
  sigaction(SIGPIPE, &before, nullptr);
}

TEST(InitOptions, FromEnvironment) {
  auto o = InitOptions::from_env({{"COHORT_TIMEOUT", "2.5"}, {"COHORT_BACKEND", "gloo"}, {"GLOO_SOCKET_IFNAME", "lo"}});
  EXPECT_EQ(o.timeout(), 2500ms);
  EXPECT_EQ(o.backend(), "gloo");
  EXPECT_EQ(o.network_interface(), "lo");
  EXPECT_THROW(InitOptions::from_env({{"COHORT_TIMEOUT", "-1"}}), cohort::ConfigError);
  // c10d reads 0 ms as "no timeout": a zero or sub-millisecond timeout would be unbounded.
  EXPECT_THROW(InitOptions::from_env({{"COHORT_TIMEOUT", "0"}}), cohort::ConfigError);
  EXPECT_EQ(InitOptions::from_env({{"COHORT_TIMEOUT", "0.0001"}}).timeout(), 1ms);
  EXPECT_THROW(InitOptions::from_env({{"COHORT_JOIN_TIMEOUT", "inf"}}), cohort::ConfigError);
  EXPECT_THROW(InitOptions().timeout(0ms).validate(), cohort::ConfigError);
  EXPECT_THROW(InitOptions().heartbeat_interval(10ms).validate(), cohort::ConfigError);
  // Note [Gloo threads]
  EXPECT_EQ(InitOptions().gloo_threads(), 4);
  EXPECT_EQ(InitOptions::from_env({{"COHORT_GLOO_THREADS", "2"}}).gloo_threads(), 2);
  for (const char* bad : {"0", "-3", "two", "2x"})
    EXPECT_THROW(InitOptions::from_env({{"COHORT_GLOO_THREADS", bad}}), cohort::ConfigError) << bad;
  EXPECT_THROW(InitOptions().gloo_threads(65).validate(), cohort::ConfigError);
  EXPECT_THROW(cohort::comm::World::init(cohort::comm::WorldInfo{}, InitOptions().backend("mpi")),
               cohort::ConfigError);
}

}  // namespace

namespace {

// Note [A broken group] (comm/arrival_board.h): 8 ranks; rank 7 leaves the world
// (its sockets close) while the others wait in an all_reduce. Only its peers in
// Gloo's algorithm see the closed connection; the others used to wait on live ranks
// that had already left, for the whole timeout (60 s here). Now every rank leaves
// with a CommError, the others quoting the rank that lost its peer; the test gives
// them 30 s.
TEST(ThreadWorld, WhenAPeerLeavesEveryRankLeavesTheCollectiveNotOnlyItsNeighbours) {
  constexpr int kRanks = 8;
  auto options = quick().timeout(60s);
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::atomic<int> verdicts{0};
  std::vector<std::future<std::string>> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.push_back(std::async(std::launch::async, [=, &verdicts]() -> std::string {
      auto world = World::init_with_store(store, r, kRanks, options);
      world.group().barrier();
      if (r == kRanks - 1) return "left";  // its world, sockets and all, goes now
      auto t = torch::ones({1 << 16});
      std::string verdict;
      try {
        world.group().all_reduce(t);
        verdict = "completed";
      } catch (const cohort::CommError& e) {
        verdict = std::string("CommError: ") + e.what();
      } catch (const std::exception& e) {
        verdict = std::string("other error: ") + e.what();
      }
      ++verdicts;  // keep every world until all have their verdict
      while (verdicts.load() < kRanks - 1) std::this_thread::yield();
      return verdict;
    }));
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  for (int r = 0; r < kRanks - 1; ++r)
    ASSERT_EQ(ranks[r].wait_until(deadline), std::future_status::ready)
        << "rank " << r << " still waits on ranks that left the collective";
  int abandoned = 0;
  for (int r = 0; r < kRanks - 1; ++r) {
    const auto verdict = ranks[r].get();
    EXPECT_EQ(verdict.rfind("CommError: ", 0), 0u) << "rank " << r << ": " << verdict;
    if (verdict.find("was abandoned: another member's collective on this group failed (rank ") != std::string::npos)
      ++abandoned;
  }
  EXPECT_EQ(ranks[kRanks - 1].get(), "left");
  // With 8 ranks, Gloo's all_reduce connects no rank to every other in one step:
  // some rank learnt of the failure from the mark, not from a socket.
  EXPECT_GE(abandoned, 1);
}

}  // namespace
