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
//
// Note [A broken group]
// A collective that fails on one rank leaves the group unusable for all. Over Gloo
// only the ranks connected to a dead peer see its connection close; a rank further
// along the ring waits for data from live peers that have already left the
// collective, until its own timeout (4 fault-tolerant replicas, one killed: the
// survivor opposite it waited the whole collective timeout and was dropped from the
// next quorum as if it had died). So the first rank whose collective fails on a
// closed connection marks the group broken in the store (mark_broken, with its
// reason; a timeout is not marked, as every member waits out the same one and
// names the missing ranks itself), and a rank that has
// been waiting in a collective for longer than kBrokenPoll (20 ms) has the board's
// thread look for that mark every kBrokenPoll; its wait then ends at once with a
// CommError that quotes the reason. Short waits never touch the store, and the mark
// is one key per group.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
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

  // Note [A broken group]. Marks the group broken for every member, keeping this
  // process's reason; never throws (an unreachable store leaves only the mark here).
  void mark_broken(const std::string& why);
  // The reason a member gave, once this process has seen the mark; "" before.
  std::string broken() const;
  // While a wait is in progress (begin_wait .. end_wait), the board's thread looks
  // for the mark every kBrokenPoll once the same waits have lasted that long.
  void begin_wait();
  void end_wait();
  static constexpr std::chrono::milliseconds kBrokenPoll{20};

 private:
  void publish_loop();
  void publish_now();
  void look_for_broken_mark();
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
  mutable std::mutex broken_mu_;  // guards broken_
  std::string broken_;
  std::atomic<bool> has_broken_{false};
  std::atomic<int> waiting_{0};
  std::atomic<std::int64_t> waits_begun_{0};
  std::int64_t waits_seen_ = -1;  // publisher thread only
  std::thread thread_;
};

}  // namespace cohort::comm
