// The loop's indexes as plain data (Note [The loop's cost per wake-up] in
// store/server_loop.h): deadlines in time order, waiters by key.
#include <gtest/gtest.h>

#include "cohort/store/deadlines.h"
#include "cohort/store/waiters.h"

namespace {
using cohort::store::DeadlineQueue;
using cohort::store::WaiterIndex;
using Clock = cohort::store::net::Clock;
using namespace std::chrono_literals;

TEST(StoreLoopIndexes, DeadlinesComeDueEarliestFirstAndEachIdHoldsOne) {
  DeadlineQueue q;
  const auto t = Clock::now();
  EXPECT_FALSE(q.next());
  q.set(3, t + 3s);
  q.set(1, t + 1s);
  q.set(2, t + 1s);
  EXPECT_EQ(q.next(), t + 1s);
  EXPECT_EQ(q.due(t), std::vector<std::uint64_t>{});
  EXPECT_EQ(q.due(t + 1s), (std::vector<std::uint64_t>{1, 2}));
  q.set(1, t + 5s);  // replaces its deadline
  EXPECT_EQ(q.size(), 3u);
  EXPECT_EQ(q.due(t + 3s), (std::vector<std::uint64_t>{2, 3}));
  q.clear(2);
  q.clear(2);
  q.clear(3);
  EXPECT_EQ(q.next(), t + 5s);
  EXPECT_EQ(q.due(t + 10s), std::vector<std::uint64_t>{1});
  q.clear(1);
  EXPECT_EQ(q.size(), 0u);
  EXPECT_FALSE(q.next());
}

TEST(StoreLoopIndexes, WaitersAreFoundByEachOfTheirKeysUntilRemoved) {
  WaiterIndex w;
  w.add(7, {"a", "b", "a"});
  w.add(4, {"b"});
  EXPECT_EQ(w.of("a"), std::vector<std::uint64_t>{7});
  EXPECT_EQ(w.of("b"), (std::vector<std::uint64_t>{4, 7}));
  EXPECT_FALSE(w.has_waiters("c"));
  w.remove(7, {"a", "b", "a"});
  EXPECT_FALSE(w.has_waiters("a"));
  EXPECT_EQ(w.of("b"), std::vector<std::uint64_t>{4});
  w.remove(4, {"b"});
  EXPECT_EQ(w.keys(), 0u);
}

}  // namespace
