// agree_on_settings: ranks as threads over one in-memory store, one of them started
// with other flags; and the pure message, which names each setting, its values and
// the ranks holding each.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "cohort/comm/config_agreement.h"
#include "cohort/comm/world.h"
#include "cohort/errors.h"
#include "support/thread_world.h"

namespace {
using cohort::comm::agree_on_settings;
using cohort::comm::describe_disagreement;
using cohort::comm::Setting;
using cohort::comm::World;

std::vector<Setting> flags(const std::string& tp, const std::string& seed) {
  return {{"--tp", tp}, {"--seed", seed}, {"--checkpoint-dir", "/tmp/a b;c"}};
}

TEST(ConfigAgreement, RanksWithTheSameSettingsGoOn) {
  std::atomic<int> passed{0};
  cohort::testing::run_thread_world(3, [&](World& world) {
    // The same settings in another order agree too.
    auto mine = flags("2", "7");
    if (world.rank() == 1) std::swap(mine[0], mine[2]);
    agree_on_settings(world, mine);
    ++passed;
    world.group().barrier();  // the group is still in step
  });
  EXPECT_EQ(passed.load(), 3);
}

// Issue 46, item 10: every rank throws the same ConfigError, naming the flag, each
// value and the ranks that hold it, and no rank waits for a collective of another shape.
TEST(ConfigAgreement, ARankWithAnotherFlagIsNamedOnEveryRank) {
  std::vector<std::string> messages(3);
  cohort::testing::run_thread_world(3, [&](World& world) {
    try {
      agree_on_settings(world, flags(world.rank() == 1 ? "4" : "2", "7"));
      ADD_FAILURE() << "rank " << world.rank() << ": expected a ConfigError";
    } catch (const cohort::ConfigError& e) {
      messages[world.rank()] = e.what();
    }
  });
  const std::string expected =
      "cohort: the ranks were started with different settings: --tp differs across ranks: 2 on ranks 0,2; 4 on "
      "rank 1. Pass the same flags to every rank (on every node, the same program arguments)";
  for (const auto& m : messages) EXPECT_EQ(m, expected);
}

TEST(ConfigAgreement, EverySettingThatDiffersIsNamedWithEachValue) {
  std::vector<std::string> messages(4);
  cohort::testing::run_thread_world(4, [&](World& world) {
    auto mine = flags(world.rank() == 3 ? "1" : "2", world.rank() == 0 ? "5" : "7");
    if (world.rank() == 2) mine.push_back({"--dropout", "0.1"});
    try {
      agree_on_settings(world, mine);
    } catch (const cohort::ConfigError& e) {
      messages[world.rank()] = e.what();
    }
  });
  for (const auto& m : messages) {
    EXPECT_NE(m.find("--tp differs across ranks: 2 on ranks 0-2; 1 on rank 3."), std::string::npos) << m;
    EXPECT_NE(m.find("--seed differs across ranks: 5 on rank 0; 7 on ranks 1-3."), std::string::npos) << m;
    EXPECT_NE(m.find("--dropout differs across ranks: (not set) on ranks 0,1,3; 0.1 on rank 2."), std::string::npos)
        << m;
    EXPECT_EQ(m.find("--checkpoint-dir"), std::string::npos) << m;  // alike everywhere
  }
}

TEST(ConfigAgreement, TheMessageIsPure) {
  EXPECT_EQ(describe_disagreement({flags("2", "1"), flags("2", "1")}, {0, 1}), "");
  EXPECT_EQ(describe_disagreement({{{"--a", ""}}, {{"--a", "x"}}}, {4, 9}),
            "cohort: the ranks were started with different settings: --a differs across ranks: \"\" on rank 4; x on "
            "rank 9. Pass the same flags to every rank (on every node, the same program arguments)");
  // Many values: the first 8 are listed, the rest counted.
  std::vector<std::vector<Setting>> many;
  std::vector<int> ranks;
  for (int r = 0; r < 10; ++r) {
    many.push_back({{"--seed", std::to_string(r)}});
    ranks.push_back(r);
  }
  const auto m = describe_disagreement(many, ranks);
  EXPECT_NE(m.find("7 on rank 7; and 2 other values."), std::string::npos) << m;
}

}  // namespace
