// Which agent publishes a lost node's ranks dead (Note [Who publishes a vacant slot
// under etcd] in launcher/vacant_slots.h).
#include <gtest/gtest.h>

#include "cohort/launcher/vacant_slots.h"

namespace {

using cohort::elastic::RendezvousState;
using cohort::launcher::keeps_slots;
using cohort::launcher::StoreRole;

TEST(KeepsSlots, TheHostKeepsThemAndAClientNever) {
  RendezvousState s;
  s.participants = {{"a", 0}, {"b", 1}};
  EXPECT_TRUE(keeps_slots(s, "b", StoreRole::kHost));
  EXPECT_FALSE(keeps_slots(s, "a", StoreRole::kClient));
}

TEST(KeepsSlots, UnderEtcdTheLowestLiveSlotKeepsThemAndTheNextTakesOverWhenItIsLost) {
  RendezvousState s;
  s.participants = {{"node-c", 2}, {"node-a", 0}, {"node-b", 1}, {"late", -1}};
  for (const char* n : {"node-a", "node-b", "node-c", "late"})
    EXPECT_EQ(keeps_slots(s, n, StoreRole::kReplicated), std::string(n) == "node-a") << n;
  s.participants.erase("node-a");  // lost: the record drops it
  for (const char* n : {"node-b", "node-c", "late"})
    EXPECT_EQ(keeps_slots(s, n, StoreRole::kReplicated), std::string(n) == "node-b") << n;
  s.participants = {{"late", -1}};  // no slot assigned yet: nobody keeps them
  EXPECT_FALSE(keeps_slots(s, "late", StoreRole::kReplicated));
}

}  // namespace
