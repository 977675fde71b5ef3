#include "cohort/elastic/dynamic_rendezvous.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <thread>

#include "cohort/store/store_ops.h"
#include "cohort/store/store_wait.h"
#include "cohort/util/bytes.h"

namespace cohort::elastic {
namespace {

// Note [Waiting without reading the record]: how long a waiting agent waits on the
// store at a time before it calls its poll function, and how often it reads the
// whole record regardless.
constexpr Millis kWaitSlice(100);
Millis read_anyway(int max_nodes) { return Millis(std::clamp(max_nodes * 5, 1000, 10000)); }
// Note [Joins folded by any agent]: tickets per key of announced joins, and how long
// a ticket whose name never came holds the folding up.
constexpr std::int64_t kJoinsPerBucket = 32;
constexpr auto kGapGrace = std::chrono::seconds(5);
constexpr Millis kGapLook(5);  // how soon a folder that met such a ticket looks again

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
  // One look: get() would block on a missing key, and under etcd the record may be
  // deleted between two calls (Note [A record deleted under a writer]).
  const auto seen = store::look(*store_, key("state"));
  if (!seen) return RendezvousState{};
  auto state = decode(util::from_bytes(*seen));
  watch_.observe(state, steady_now(), blind_after(settings_));
  return state;
}

RendezvousState DynamicRendezvous::update(const std::function<bool(RendezvousState&)>& change) {
  const auto k = key("state");
  auto seen = store::look(*store_, k).value_or(std::vector<std::uint8_t>{});
  while (true) {
    const RendezvousState before = seen.empty() ? RendezvousState{} : decode(util::from_bytes(seen));
    RendezvousState state = before;
    if (!change(state)) return state;
    auto desired = util::to_bytes(encode(state));
    if (desired == seen) return state;
    auto now_there = store_->compareSet(k, seen, desired);
    if (now_there == desired) {
      if (waiters_care(before, state)) {  // Note [Waiting without reading the record]
        const auto n = store_->add(key("changes"), 1);
        store_->set(key("changed/" + std::to_string(n)), std::vector<std::uint8_t>{});
      }
      return state;
    }
    // Note [A record deleted under a writer]: c10d answers a failed swap on a key
    // that is not there with the expected value, `seen` itself. Under etcd the last
    // agent of a finished job deletes the record (Note [A finished job's keys in
    // etcd] in launcher/elastic_agent.cpp), and a writer that had read it would
    // swap against it forever: so an answer equal to `seen` is looked at again.
    if (now_there == seen) now_there = store::look(*store_, k).value_or(std::vector<std::uint8_t>{});
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

// Note [Joins folded by any agent]
// Every agent used to write itself into the record with its own compare-and-set.
// Agents joining together then conflicted: each write of the whole record (O(N)
// bytes) let one of them in and sent the others back to try again, O(N^2) writes
// of O(N) bytes for a round of N: 256 agents took 2.2 s and 85 MB, and 512 had no
// round after the 600 s join timeout and 12.5 GB (docs/scale.md). Now an agent
// first announces itself, cheaply and without conflicts: a ticket from a counter,
// and "<ticket> <node>" appended to the ticket's bucket of kJoinsPerBucket. Every
// write of the record by any agent in next_round() then applies the announced
// joins not yet applied (tickets joins_folded+1 ..), in ticket order, each as that
// node's own join would (next_join_action for it), before its own action. So one
// write takes in every agent that announced since the last, and a round of N
// costs about N / (agents per write) writes. Ranks still come from the sorted node
// names, so the order of folding changes nothing. A ticket whose name has not come
// (its agent died between the two calls) holds the folding for kGapGrace, then is
// passed over; an agent whose ticket is not yet folded joins by its own action, as
// before, and a later fold of its ticket finds it there and changes nothing.
namespace {
class JoinLog {
 public:
  JoinLog(c10d::Store& store, std::string prefix) : store_(store), prefix_(std::move(prefix)) {}

  std::int64_t announce(const std::string& node) {
    const auto ticket = store_.add(prefix_ + "joins", 1);
    store::append_bytes(store_, bucket_key(ticket), util::to_bytes(std::to_string(ticket) + " " + node + "\n"));
    return ticket;
  }

  // Applies the announced joins after `s.joins_folded` up to `upto` (Note [Joins
  // folded by any agent]).
  // A ticket whose name has not come yet stops joins_folded (the tickets after it
  // are still applied: applying a join twice changes nothing), for kGapGrace.
  void fold(RendezvousState& s, std::int64_t upto, Millis wall, const RendezvousSettings& settings) {
    bool gap = false;
    for (auto t = s.joins_folded + 1; t <= upto; ++t) {
      auto it = names_.find(t);
      if (it == names_.end()) {
        fetch(t);
        it = names_.find(t);
      }
      if (it == names_.end()) {
        const auto first = gaps_.emplace(t, steady_now()).first->second;
        gap = gap || steady_now() - first < kGapGrace;
      } else if (!s.closed) {
        const auto action = next_join_action(s, it->second, wall, false, settings);
        if (action == JoinAction::kAddToParticipants || action == JoinAction::kAddToWaitList ||
            action == JoinAction::kTakeSlot)
          apply(s, action, it->second, wall, settings);
      }
      if (!gap) s.joins_folded = t;
    }
    gap_left_ = gap;
  }
  // Whether the last fold stopped at a ticket whose name had not come yet: its agent
  // is between its two calls, and the folder looks again soon (Note [The latest
  // arrival folds]).
  bool gap_left() const { return gap_left_; }

  std::int64_t announced() { return store_.add(prefix_ + "joins", 0); }

 private:
  std::string bucket_key(std::int64_t ticket) const {
    return prefix_ + "joins/" + std::to_string((ticket - 1) / kJoinsPerBucket);
  }
  void fetch(std::int64_t ticket) {
    const auto text = store::look(store_, bucket_key(ticket));
    if (!text) return;
    std::istringstream in(util::from_bytes(*text));
    std::int64_t t = 0;
    std::string node;
    while (in >> t >> node) names_[t] = node;
  }

  c10d::Store& store_;
  std::string prefix_;
  std::map<std::int64_t, std::string> names_;
  std::map<std::int64_t, Millis> gaps_;
  bool gap_left_ = false;
};
}  // namespace

// Note [The latest arrival folds]
// Folding alone still had every agent of a burst read, decode, fold and write the
// whole record at least once, most of them more than once as their writes raced:
// about 4 decodes of an O(N) record per agent, 2.5 s of decoding for 1,024 agents on
// 2 cores. Only one agent has to write: the one that announced last, whose write
// takes in everyone. So an agent that finds a later ticket than its own right after
// announcing does not write; it waits for the change that matters to it (the round
// completes, or its last call is set: Note [Waiting without reading the record]),
// and reads the record then, once. The latest agent when it looked writes at once.
// The latest agent may find an earlier ticket whose name is not there yet (its
// agent is between its add and its append, and saw the later ticket, so it waits):
// it then looks again every kGapLook until the name comes, rather than leaving that
// agent to its read_anyway (1 s for 64 agents, found by the harness).
// An agent that was the latest and died before its write costs the others
// read_anyway(max_nodes) (1 s, up to 10 s at 2,000 agents), after which each writes
// itself in as before.

// Note [Waiting without reading the record]
// An agent waiting for its round used to read the whole record every 50 ms: at N
// agents, N reads of O(N) bytes 20 times a second. Now every write that waiting
// agents must see (waiters_care: the round, its completion, its last call, the
// wait list, a vacant slot) also adds to a counter, `changes`, and sets the key
// `changed/<n>` of its new value. A waiting agent waits on the store for the next
// such key (a wait the store answers when the key is set: no polling, and it hears
// of the change at once), in slices of kWaitSlice between calls of its poll
// function; it reads the record when the key came, when the round's last call has
// come, and every read_anyway(max_nodes) in any case (1 s, longer past 200 agents) (a writer that died between its write and its add; a
// silent node to drop).
Round DynamicRendezvous::next_round(const std::function<void()>& poll) {
  const Millis deadline = steady_now() + settings_.join_timeout();
  JoinLog joins(*store_, prefix_);
  const auto ticket = joins.announce(node_);
  std::int64_t changes_seen = -1;
  // Note [The latest arrival folds]: an agent that is not the latest to announce
  // leaves its join to a later one, and writes only if nobody has within
  // read_anyway(max_nodes).
  if (joins.announced() != ticket) {
    changes_seen = store_->add(key("changes"), 0);
    const auto next_change = key("changed/" + std::to_string(changes_seen + 1));
    const auto until = std::min(deadline, steady_now() + read_anyway(settings_.max_nodes()));
    while (steady_now() < until) {
      if (poll) poll();
      const auto slice = std::min(kWaitSlice, std::max(Millis(1), until - steady_now()));
      if (store::wait_for_key(*store_, next_change, slice, Millis(10))) break;
    }
  }
  while (true) {
    JoinAction action = JoinAction::kWait;
    bool rejoin = false;
    const auto announced = std::max(ticket, joins.announced());
    changes_seen = store_->add(key("changes"), 0);
    const auto state = update([&](RendezvousState& s) {
      const auto mono = steady_now(), wall = wall_now();
      drop_dead_nodes(s, watch_, mono, settings_);
      joins.fold(s, announced, wall, settings_);
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
      case JoinAction::kWait: {
        // Note [Waiting without reading the record]
        const auto until = steady_now() + (joins.gap_left() ? kGapLook : read_anyway(settings_.max_nodes()));
        const auto next_change = key("changed/" + std::to_string(changes_seen + 1));
        while (true) {
          if (poll) poll();
          auto slice = std::min(kWaitSlice, std::max(Millis(1), std::min(until, deadline) - steady_now()));
          if (state.last_call && !state.complete)
            slice = std::min(slice, std::max(Millis(1), *state.last_call - wall_now()));
          if (store::wait_for_key(*store_, next_change, slice, Millis(10))) break;
          const auto mono = steady_now();
          if (mono >= until || mono >= deadline) break;
          if (state.last_call && !state.complete && wall_now() >= *state.last_call) break;
        }
        break;
      }
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
