#include "cohort/elastic/dynamic_rendezvous.h"

#include <fmt/format.h>

#include <thread>

#include "cohort/util/bytes.h"

namespace cohort::elastic {
namespace {

constexpr auto kPollEvery = std::chrono::milliseconds(50);

double seconds_of(Millis m) { return std::chrono::duration<double>(m).count(); }

}  // namespace

Millis wall_now() {
  return std::chrono::duration_cast<Millis>(std::chrono::system_clock::now().time_since_epoch());
}

Millis steady_now() {
  return std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now().time_since_epoch());
}

DynamicRendezvous::DynamicRendezvous(c10::intrusive_ptr<c10d::Store> store, std::string run_id, std::string node,
                                     RendezvousSettings settings)
    : store_(std::move(store)),
      prefix_("cohort/rdzv/" + run_id + "/"),
      node_(std::move(node)),
      settings_(settings) {}

std::string DynamicRendezvous::key(const std::string& name) const { return prefix_ + name; }

RendezvousState DynamicRendezvous::read() {
  const auto k = key("state");
  // get() blocks on a missing key, so look first; the record is never deleted.
  if (!store_->check({k})) return RendezvousState{};
  auto state = decode(util::from_bytes(store_->get(k)));
  watch_.observe(state, steady_now());
  return state;
}

RendezvousState DynamicRendezvous::update(const std::function<bool(RendezvousState&)>& change) {
  const auto k = key("state");
  std::vector<std::uint8_t> seen;
  if (store_->check({k})) seen = store_->get(k);
  while (true) {
    RendezvousState state = seen.empty() ? RendezvousState{} : decode(util::from_bytes(seen));
    if (!change(state)) return state;
    auto desired = util::to_bytes(encode(state));
    if (desired == seen) return state;
    auto now_there = store_->compareSet(k, seen, desired);
    if (now_there == desired) return state;
    seen = std::move(now_there);  // somebody else wrote first: decide again on theirs
  }
}

namespace {
// Note [A finished round that lost a node]: a node dropped from a complete round
// (its heartbeats stopped) leaves the others with the ranks of the full round, e.g.
// rank 1 of a round that now has one node. Such a round cannot be handed out: a
// participant that finds it leaves it and joins again, so the round reopens as
// soon as its last member has left (the next round number), with ranks 0..n-1.
bool ranks_are_whole(const RendezvousState& s) {
  if (s.held) return true;  // Note [Held rounds]: a vacant slot is the point
  std::vector<bool> seen(s.participants.size(), false);
  for (const auto& [node, rank] : s.participants) {
    if (rank < 0 || static_cast<std::size_t>(rank) >= seen.size() || seen[static_cast<std::size_t>(rank)]) return false;
    seen[static_cast<std::size_t>(rank)] = true;
  }
  return true;
}
}  // namespace

Round DynamicRendezvous::next_round(const std::function<void()>& poll) {
  const Millis deadline = steady_now() + settings_.join_timeout();
  while (true) {
    JoinAction action = JoinAction::kWait;
    bool rejoin = false;
    const auto state = update([&](RendezvousState& s) {
      const auto mono = steady_now(), wall = wall_now();
      drop_dead_nodes(s, watch_, mono, settings_);
      action = next_join_action(s, node_, wall, mono >= deadline, settings_);
      rejoin = action == JoinAction::kFinish && !ranks_are_whole(s);
      if (rejoin)
        elastic::leave(s, node_, settings_);  // Note [A finished round that lost a node]
      else
        apply(s, action, node_, wall, settings_);
      return true;
    });
    if (rejoin) continue;
    switch (action) {
      case JoinAction::kFinish: {
        Round r;
        r.round = state.round;
        r.rank = state.participants.at(node_);
        // Note [Held rounds]: a vacant slot is an empty name.
        r.world_size = state.held ? state.slots : static_cast<int>(state.participants.size());
        r.nodes.resize(static_cast<std::size_t>(r.world_size));
        for (const auto& [node, rank] : state.participants) r.nodes.at(static_cast<size_t>(rank)) = node;
        r.restarts = state.restarts;
        r.held = state.held;
        return r;
      }
      case JoinAction::kErrorClosed:
        throw RendezvousClosedError("cohort run: the job's rendezvous is closed (the job has finished or failed); "
                                    "start a new job with another --rdzv-id to run again");
      case JoinAction::kRemoveSelf:
      case JoinAction::kErrorTimeout:
        if (state.held && state.complete)  // Note [Held rounds]: a spare
          throw TimeoutError(
              fmt::format("waited {:.0f} s (join_timeout) as a spare for a vacant slot of this job "
                          "(--fault-tolerance in-process keeps the {} node(s) it started with, and none left{}).\n  "
                          "fix: nothing is wrong with the job; start this node again when a node is lost, or raise "
                          "--rdzv-conf join_timeout=SECONDS to keep it waiting",
                          seconds_of(settings_.join_timeout()), state.slots,
                          state.done.empty() ? "" : "; the job is finishing"),
              "rendezvous", {});
        throw TimeoutError(
            fmt::format("waited {:.0f} s (join_timeout) for a rendezvous round of {} to {} nodes; {} "
                        "node(s) took part, {} waited.\n  fix: start `cohort run` on more nodes with the same "
                        "--rdzv-endpoint and --rdzv-id, lower the minimum of --nnodes, or raise "
                        "--rdzv-conf join_timeout=SECONDS",
                        seconds_of(settings_.join_timeout()), settings_.min_nodes(), settings_.max_nodes(),
                        state.participants.size(), state.wait_list.size()),
            "rendezvous", {});
      case JoinAction::kWait:
        if (poll) poll();
        std::this_thread::sleep_for(kPollEvery);
        break;
      default:
        break;  // it changed the record: look again at once
    }
  }
}

void DynamicRendezvous::leave() {
  update([&](RendezvousState& s) {
    if (!s.participants.count(node_) && !s.wait_list.count(node_)) return false;
    elastic::leave(s, node_, settings_);
    return true;
  });
}

std::vector<std::string> DynamicRendezvous::keep_alive() {
  std::vector<std::string> dropped;
  update([&](RendezvousState& s) {
    heartbeat(s, node_);
    dropped = drop_dead_nodes(s, watch_, steady_now(), settings_);
    return true;
  });
  return dropped;
}

}  // namespace cohort::elastic
