#pragma once
// Note [Arrival board]
// A collective that times out is only useful if the error says *who* did not come.
// Every rank therefore publishes, in the store, the sequence number and name of the
// last collective it entered on each group, the names of the kHistory - 1 before
// it, plus a heartbeat time. A background
// thread does the writes, so a collective itself never waits on the store or wakes
// a thread:
//  * entering a collective copies its name and bumps the counter under an
//    uncontended mutex (the publisher holds it for a few nanoseconds per tick);
//  * the thread ticks every kTick (50 ms), publishes when the counter moved, and
//    re-publishes every heartbeat interval even when nothing changed.
// The board talks to the store over a connection of its own, so that a long
// blocking wait on the main connection (a sub-group's creation, Gloo's mesh set-up)
// can never hold back a heartbeat and make a live rank look dead. diagnose() reads
// the peers under one overall deadline.
// When rank r times out in collective #n, diagnose(n, op) reads every peer's entry:
//  - seq >= n, its #n was `op` (or is too far back to know) -> it arrived;
//  - seq >= n, its #n was another collective -> "elsewhere": the ranks called
//    different collectives, which no network problem explains;
//  - seq <  n, heartbeat is fresh  -> alive but has not called #n ("behind");
//  - heartbeat older than 3 beats  -> dead or frozen ("silent");
//  - no entry at all               -> never started or died before publishing.
// Timeouts are seconds to minutes and kTick is 50 ms, so an arrived rank has
// always published before anyone can time out waiting for it. Heartbeat ages compare
// clocks across hosts; they assume NTP-level agreement (seconds), not more.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cohort::comm {

struct PeerStatus {
  enum class State { kArrived, kElsewhere, kBehind, kSilent, kNeverSeen, kUnknown };
  int rank = 0;  // global rank
  State state = State::kUnknown;
  std::int64_t seq = 0;
  std::string op;
  std::string op_at_seq;  // kElsewhere: what it called as the collective diagnosed
  double seconds_since_heartbeat = 0;
};

class ArrivalBoard {
 public:
  // `key_prefix` must be unique per group; `ranks` are global ranks, and `self` is
  // this process's position in `ranks`.
  ArrivalBoard(c10::intrusive_ptr<c10d::Store> store, std::string key_prefix,
               std::vector<int> ranks, int self, std::chrono::milliseconds interval);
  ~ArrivalBoard();
  ArrivalBoard(const ArrivalBoard&) = delete;
  ArrivalBoard& operator=(const ArrivalBoard&) = delete;

  // Records that this rank entered a collective; returns its sequence number
  // (1-based). `op` is copied (up to 31 characters).
  std::int64_t enter(const char* op);

  // Reads every peer's entry, comparing what each called as collective #seq with
  // `op`. Never throws: an unreachable store gives kUnknown.
  std::vector<PeerStatus> diagnose(std::int64_t seq, const std::string& op) const;

  // "rank 3 (alive, still at barrier #4); rank 1 (no heartbeat for 12.0 s at ...)"
  static std::string describe(const std::vector<PeerStatus>& peers);
  // The diagnosis of rank `self` (global) timing out in `op` #seq, one sentence:
  // "ranks called different collectives: rank 0 in broadcast #9, rank 1 in
  // all_reduce #9", "not arrived: <describe>", or, when every peer arrived,
  // that the transport stalled.
  static std::string explain(int self, const std::string& op, std::int64_t seq, const std::vector<PeerStatus>& peers);
  static std::vector<int> missing(const std::vector<PeerStatus>& peers);
  static constexpr int kHistory = 8;

 private:
  void publish_loop();
  void publish_now();
  std::string key(int position) const;

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  std::vector<int> ranks_;
  int self_;
  std::chrono::milliseconds interval_;

  std::mutex op_mu_;  // guards seq_ and ops_
  std::int64_t seq_ = 0;
  char ops_[kHistory][32] = {"init"};  // collective #s was ops_[s % kHistory]
  std::int64_t published_seq_ = -1;  // publisher thread only
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cohort::comm
