#pragma once
// One agreed decision among the members of a quorum, through the job's store: did
// every member succeed (commit) or not (abort)? Every member gets the same answer,
// however members fail around it.
//
// Note [One decision per vote]
// A collective can succeed on one rank and fail on another (a peer dies after A has
// received its last chunk but before B has), so "my all-reduce succeeded" is not a
// decision the ranks can each take alone: A would apply the step and B redo it. The
// decision is one store key, written once with compareSet: the member whose success
// vote completes the count writes "commit", and a member that failed, a watcher that
// hears of a death, or a member whose wait ran out writes "abort". Whichever lands
// first is the decision; everyone reads it back. So "commit" means every member had
// succeeded, and a step is applied by all survivors or by none.
#include <chrono>
#include <functional>
#include <string>

#include "cohort/compat/c10d.h"

namespace cohort::fault_tolerance {

enum class Decision { kCommit, kCommitAndRegroup, kAbort };

struct VoteResult {
  Decision decision = Decision::kAbort;
  bool timed_out = false;  // this member's wait ran out and it wrote the abort
};

// The store key holding the decision of the vote named `vote`.
std::string decision_key(const std::string& vote);

// Votes `ok` in the vote named `vote` among `members` members and returns the
// decision. A success vote waits at most `timeout` for the others. `regroup` is
// asked only by the member that completes the count: when it returns true the
// decision is kCommitAndRegroup (new replicas wait to join).
VoteResult vote(c10d::Store& store, const std::string& vote, int members, bool ok, std::chrono::milliseconds timeout,
                const std::function<bool()>& regroup = nullptr);

// Writes "abort" unless the vote is decided already; returns the decision.
Decision abort_vote(c10d::Store& store, const std::string& vote);

// Deletes the vote's keys. Only once no member can still read them: see Note
// [Forgetting committed votes] in replica_group.cpp.
void forget_vote(c10d::Store& store, const std::string& vote);

}  // namespace cohort::fault_tolerance
