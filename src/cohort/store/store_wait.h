#pragma once
// Note [A wait that runs out over c10d's TCPStore]
// A member waits on the store with a bound (a vote's decision, a death event, the
// job's configuration), and the bound may run out: a member stopped, or a node gone
// with no agent left to announce it. Over cohort's store and HashStore such a wait
// ends cleanly. Over c10d's TCPStore (the job's store when there are several nodes)
// it does not: LibTorch 1.13's client leaves the connection out of step, and its
// next request fails ("Connection reset by peer", or a garbled length read as a
// value), so a survivor died "losing the job's store" while the store was fine and
// another hung reading a reply that never came (found by review, 2 of 15 SIGSTOPs
// in a vote; Vote.OverC10dsTcpStoreAVoteThatTimesOutLeavesTheConnectionInStep).
// So over a TCPStore, under any PrefixStores, a bounded wait is a poll of check(),
// which is answered at once and never runs out mid-request, with a pause that
// starts at 0.1 ms and doubles up to `longest_pause`: a decision that comes soon is
// seen within about the time already waited.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace cohort::store {

// Whether `key` was set within `timeout`. Throws what the store throws when it
// fails (not when the bound runs out).
bool wait_for_key(c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout,
                  std::chrono::microseconds longest_pause = std::chrono::milliseconds(2));

// Whether `store` is c10d's TCPStore, under any PrefixStores.
bool is_c10d_tcp_store(c10d::Store& store);

}  // namespace cohort::store
