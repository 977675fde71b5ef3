#include "cohort/launcher/round_end.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>
#include <thread>

#include "cohort/launcher/failure_record.h"

namespace cohort::launcher {
namespace {

using elastic::DynamicRendezvous;
using elastic::RendezvousState;
using elastic::Round;
using Clock = std::chrono::steady_clock;
constexpr auto kLook = std::chrono::milliseconds(100);
// How long a finished node leaves a vanished node's agent to close the job with its
// own root cause (close_with_root_cause gathers records for 2.5 s) before doing so.
constexpr auto kGatherLost = std::chrono::seconds(4);

// The agent hosting the store keeps it up until the other agents have left (they
// read the job's outcome from it), for at most close_timeout, watching the signals.
void linger(DynamicRendezvous& rdzv, StoreRole role, const std::function<void()>& check) {
  if (role != StoreRole::kHost) {
    rdzv.leave();
    return;
  }
  const auto deadline = Clock::now() + rdzv.settings().close_timeout();
  while (Clock::now() < deadline) {
    const auto s = rdzv.read();
    bool others = false;
    for (const auto& [node, rank] : s.participants) others = others || node != rdzv.node();
    if (!others) return;
    check();
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

int report_closed(DynamicRendezvous& rdzv, StoreRole role, const std::function<void()>& check) {
  // Said before the linger, so that the user reads the outcome at once.
  const auto cause = read_root_cause(rdzv);
  if (cause.empty())
    fmt::print(stderr, "cohort run: the job has finished; nothing left for this node to do\n");
  else
    fmt::print(stderr, "{}", cause);
  linger(rdzv, role, check);
  return cause.empty() ? 0 : 1;
}

// Note [Exit barrier]: every worker here exited 0, as torchrun's exit barrier. The
// node says so in the record and waits, heartbeats going on, until every node of
// the round is done; the agent hosting the store then closes the job and keeps the
// store up until the others have left. The wait is bounded by the other nodes'
// liveness, not by a timer: a node still training sends heartbeats and may take as
// long as it needs (a long final evaluation or save), while a node that fails or
// dies ends the wait (Note [Failures after a node finished]). A fixed bound would
// let the host close the job under a node that is still working, as torchrun's
// exit-barrier timeout does.
//
// Note [Failures after a node finished]: once a node of the round has finished,
// the job is not restarted: the finished node has left training for good, and a
// restart would train again without it from the last checkpoint. So a node whose
// workers fail then closes the job with the root cause (its failure record), and a
// node that vanishes (dropped for silence, or gone after failing without closing)
// is closed on by a finished node once the failed node has had time to do so itself.
int finish(DynamicRendezvous& rdzv, const Round& r, StoreRole role, const std::function<void()>& check) {
  rdzv.update([&](RendezvousState& s) {
    if (s.round != r.round) return false;
    s.done.insert(rdzv.node());
    return true;
  });
  // Said once the record holds it, so that a user (and a test) sees why this node
  // stays up, and that the others now know it finished.
  fmt::print(stderr, "cohort run: this node's workers finished; it waits for the round's other nodes to finish\n");
  std::optional<Clock::time_point> lost_since;
  while (true) {
    const auto s = rdzv.read();
    if (s.closed) return report_closed(rdzv, role, check);
    if (s.round != r.round || !s.participants.count(rdzv.node())) {
      fmt::print(stderr, "cohort run: this node's workers finished, but the node was dropped from the job (its "
                         "heartbeats were late); the others go on without it\n");
      return 1;
    }
    // Note [Held rounds]: the nodes now in the round's slots, not those it began with.
    bool unfinished = false;
    if (r.held)
      for (const auto& [node, rank] : s.participants) unfinished = unfinished || !s.done.count(node);
    else
      for (const auto& node : r.nodes) unfinished = unfinished || !s.done.count(node);
    if (!unfinished) break;
    const auto why = reason_to_close_after_finish(s, r, false);
    if (!why.empty() && !lost_since) lost_since = Clock::now();
    if (!why.empty() && Clock::now() - *lost_since > kGatherLost) {
      close_with_root_cause(rdzv, r, why, check);
      continue;  // and report it
    }
    check();
    std::this_thread::sleep_for(kLook);
  }
  // Under etcd every agent that sees the round done closes it: any of them may be
  // the one left (closing twice writes once).
  if (role != StoreRole::kClient)
    rdzv.update([](RendezvousState& s) {
      if (s.closed) return false;
      s.closed = true;
      return true;
    });
  linger(rdzv, role, check);
  return 0;
}

std::string reason_to_close_after_finish(const RendezvousState& s, const Round& r, bool failed_here) {
  // Note [Held rounds]: a node lost is mended by the workers, and a held round is
  // never restarted, so nothing here closes it.
  if (s.round != r.round || s.done.empty() || r.held) return "";
  std::vector<std::string> lost;
  for (const auto& node : r.nodes)
    if (!s.done.count(node) && !s.participants.count(node)) lost.push_back(node);
  const auto finished = fmt::format("after {} of the round's {} nodes had finished (a job whose nodes have "
                                    "finished is not restarted)",
                                    s.done.size(), r.nodes.size());
  if (lost.empty()) return failed_here ? "this node's workers failed " + finished : "";
  return fmt::format("node {} left or stopped sending heartbeats before finishing, {}", fmt::join(lost, ", "),
                     finished);
}

}  // namespace cohort::launcher
