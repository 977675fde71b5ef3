#include "cohort/launcher/round_end.h"

#include <fmt/format.h>

#include <thread>

#include "cohort/launcher/failure_record.h"

namespace cohort::launcher {
namespace {

using elastic::DynamicRendezvous;
using elastic::RendezvousState;
using elastic::Round;
using Clock = std::chrono::steady_clock;
constexpr auto kLook = std::chrono::milliseconds(100);

// The agent hosting the store keeps it up until the other agents have left (they
// read the job's outcome from it), for at most close_timeout.
void linger(DynamicRendezvous& rdzv, bool hosting) {
  if (!hosting) {
    rdzv.leave();
    return;
  }
  const auto deadline = Clock::now() + rdzv.settings().close_timeout();
  while (Clock::now() < deadline) {
    const auto s = rdzv.read();
    bool others = false;
    for (const auto& [node, rank] : s.participants) others = others || node != rdzv.node();
    if (!others) return;
    std::this_thread::sleep_for(kLook);
  }
}

}  // namespace

// Note [Elastic agent loop]: was this round's failure a failure, or a lost node?
// The agent drops silent nodes itself here rather than wait for its keep-alive
// thread, so that a dead node is seen within the heartbeat bound.
Verdict classify(DynamicRendezvous& rdzv, const Round& r, bool own, const std::function<void()>& check) {
  const auto& st = rdzv.settings();
  const auto deadline = Clock::now() + st.keep_alive_interval() * (st.keep_alive_max_missed() + 2) +
                        std::chrono::seconds(2);
  while (true) {
    for (const auto& node : rdzv.keep_alive())
      fmt::print(stderr, "cohort run: node {} stopped sending heartbeats; dropped from the job\n", node);
    const auto s = rdzv.read();
    if (s.closed) return Verdict::kClosed;
    if (s.failed_round >= r.round) return Verdict::kFailure;
    // A node already gone outranks a failure of our own: when a node dies, a worker
    // here may die in a way that looks like its own (a program that rethrows the
    // CommError as another type), and the restart that follows is the same.
    if (s.round != r.round || static_cast<int>(s.participants.size()) < r.world_size) return Verdict::kMembership;
    if (own) return Verdict::kFailure;
    for (const auto& rec : read_failure_records(rdzv, r))
      if (rec.own) return Verdict::kFailure;
    if (Clock::now() >= deadline) return Verdict::kFailure;
    check();
    std::this_thread::sleep_for(kLook);
  }
}

int report_closed(DynamicRendezvous& rdzv, bool hosting) {
  auto cause = read_root_cause(rdzv);
  linger(rdzv, hosting);
  if (cause.empty()) {
    fmt::print(stderr, "cohort run: the job has finished; nothing left for this node to do\n");
    return 0;
  }
  fmt::print(stderr, "{}", cause);
  return 1;
}

// Every worker here exited 0: an exit barrier, as torchrun's. The node says so in
// the record and waits, heartbeats going on, until every node of the round is done
// (or the round changed under it: a node failed after this one finished), bounded
// by join_timeout. The agent hosting the store then closes the job and keeps the
// store up until the others have left.
int finish(DynamicRendezvous& rdzv, const Round& r, bool hosting, const std::function<void()>& check) {
  rdzv.update([&](RendezvousState& s) {
    if (s.round != r.round) return false;
    s.done.insert(rdzv.node());
    return true;
  });
  const auto deadline = Clock::now() + rdzv.settings().join_timeout();
  while (Clock::now() < deadline) {
    const auto s = rdzv.read();
    bool waiting = false;
    for (const auto& node : r.nodes) waiting = waiting || (s.participants.count(node) && !s.done.count(node));
    if (!waiting || s.closed || s.round != r.round) break;
    check();
    std::this_thread::sleep_for(kLook);
  }
  if (hosting)
    rdzv.update([](RendezvousState& s) {
      s.closed = true;
      return true;
    });
  linger(rdzv, hosting);
  return 0;
}

}  // namespace cohort::launcher
