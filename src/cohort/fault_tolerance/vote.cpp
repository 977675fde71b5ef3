#include "cohort/fault_tolerance/vote.h"

#include <functional>

#include "cohort/store/store_wait.h"
#include "cohort/util/bytes.h"

namespace cohort::fault_tolerance {

namespace {

const std::string kCommit = "commit";
const std::string kCommitAndRegroup = "commit+regroup";
const std::string kAbort = "abort";

Decision parse(const std::vector<std::uint8_t>& value) {
  const auto text = util::from_bytes(value);
  if (text == kCommit) return Decision::kCommit;
  if (text == kCommitAndRegroup) return Decision::kCommitAndRegroup;
  return Decision::kAbort;
}

// Note [Waking the waiters]
// c10d's TCPStore (the workers' store of a job of several nodes) does not wake a
// client waiting on a key that compareSet writes: only set and add do. cohort's
// store and HashStore do wake it. So the waiters wait on a second key, written with
// a plain set by whoever decides (or reads a decision back) once the decision is
// in place; without it each member whose vote did not complete the count slept its
// whole timeout on c10d's store, and every step took --quorum-timeout.
std::string decided_key(const std::string& vote) { return vote + "/decided"; }

Decision decide(c10d::Store& store, const std::string& vote, const std::string& desired) {
  const auto decision = parse(store.compareSet(decision_key(vote), {}, util::to_bytes(desired)));
  store.set(decided_key(vote), util::to_bytes("1"));
  return decision;
}

}  // namespace

std::string decision_key(const std::string& vote) { return vote + "/decision"; }

Decision abort_vote(c10d::Store& store, const std::string& vote) { return decide(store, vote, kAbort); }

void forget_vote(c10d::Store& store, const std::string& vote) {
  for (const auto& key : {vote + "/votes", decision_key(vote), decided_key(vote)}) store.deleteKey(key);
}

VoteResult vote(c10d::Store& store, const std::string& vote, int members, bool ok, std::chrono::milliseconds timeout,
                const std::function<bool()>& regroup) {
  if (!ok) return {abort_vote(store, vote), false};
  const auto count = store.add(vote + "/votes", 1);
  if (count == members) return {decide(store, vote, regroup && regroup() ? kCommitAndRegroup : kCommit), false};
  const auto key = decision_key(vote);
  // Note [Waking the waiters]; Note [A wait that runs out over c10d's TCPStore]
  if (!store::wait_for_key(store, decided_key(vote), timeout)) {
    // A member never voted: it is stopped, or died unseen. Note [One decision per vote]
    const auto decided = abort_vote(store, vote);
    return {decided, decided == Decision::kAbort};
  }
  return {parse(store.get(key)), false};
}

}  // namespace cohort::fault_tolerance
