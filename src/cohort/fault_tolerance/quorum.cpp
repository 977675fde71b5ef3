#include "cohort/fault_tolerance/quorum.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "cohort/errors.h"
#include "cohort/store/store_wait.h"
#include "cohort/store/store_ops.h"
#include "cohort/util/bytes.h"

namespace cohort::fault_tolerance {

namespace keys {
std::string quorum(std::int64_t id) { return "cohort/ft/q" + std::to_string(id); }
std::string members(std::int64_t id) { return quorum(id) + "/members"; }
std::string arrived(std::int64_t id, int replica) { return quorum(id) + "/arrived/" + std::to_string(replica); }
std::string arrivals(std::int64_t id, int bucket) { return quorum(id) + "/arrivals/" + std::to_string(bucket); }
std::string dead(int replica) { return "cohort/ft/dead/" + std::to_string(replica); }
std::string latest() { return "cohort/ft/latest"; }
std::string finished() { return "cohort/ft/finished"; }
std::string configuration() { return "cohort/ft/configuration"; }
std::string join_requests() { return "cohort/ft/join_requests"; }
std::string events() { return "cohort/ft/events"; }
std::string event(std::int64_t n) { return "cohort/ft/event/" + std::to_string(n); }
}  // namespace keys

int QuorumRecord::index_of(int replica_id) const {
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].id == replica_id) return static_cast<int>(i);
  return -1;
}

std::int64_t QuorumRecord::max_step() const {
  std::int64_t best = -1;
  for (const auto& m : members) best = std::max(best, m.step);
  return best;
}

int QuorumRecord::source_of(int shard, int shards) const {
  const auto top = max_step();
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].step == top && members[i].id % shards == shard) return static_cast<int>(i);
  return -1;
}

int QuorumRecord::shard_without_source(int shards) const {
  if (max_step() < 0) return -1;
  for (const auto& m : members)
    if (source_of(m.id % shards, shards) < 0) return m.id % shards;
  return -1;
}

std::string QuorumRecord::describe() const {
  std::vector<int> ids;
  for (const auto& m : members) ids.push_back(m.id);
  return fmt::format("quorum {}: replicas {} (step {})", id, fmt::join(ids, ", "), max_step());
}

std::string QuorumRecord::encode() const {
  std::string text = std::to_string(join_requests) + ";";
  for (size_t i = 0; i < members.size(); ++i)
    text += fmt::format("{}{}:{}:{}", i ? "," : "", members[i].id, members[i].incarnation, members[i].step);
  return text;
}

QuorumRecord QuorumRecord::decode(std::int64_t id, const std::string& text) {
  if (!text.empty() && text[0] == '!') throw CommError(text.substr(1));  // Note [How a quorum forms at scale]
  QuorumRecord r;
  r.id = id;
  std::istringstream in(text);
  char sep = 0;
  if (!(in >> r.join_requests >> sep) || sep != ';')
    throw CommError(fmt::format("cohort: quorum {} in the store is not a quorum record: '{}'", id, text));
  Member m;
  char c1 = 0, c2 = 0;
  while (in >> m.id >> c1 >> m.incarnation >> c2 >> m.step) {
    r.members.push_back(m);
    if (!(in >> sep)) break;
  }
  return r;
}

int dead_incarnation(c10d::Store& store, int replica) {
  const auto key = keys::dead(replica);
  if (!store.check({key})) return -1;
  return std::stoi(util::from_bytes(store.get(key)));
}

std::int64_t next_undecided(c10d::Store& store, std::int64_t from) {
  auto t = std::max<std::int64_t>(from, 1);
  while (store.check({keys::members(t)})) ++t;
  return t;
}

namespace {

using Clock = std::chrono::steady_clock;

// The members of quorum `target - 1`, or every replica (first incarnations) before
// the first quorum.
std::vector<Member> expected_members(c10d::Store& store, std::int64_t target, int max_replicas) {
  if (target > 1 && store.check({keys::members(target - 1)}))
    return QuorumRecord::decode(target - 1, util::from_bytes(store.get(keys::members(target - 1)))).members;
  std::vector<Member> all;
  for (int id = 0; id < max_replicas; ++id) all.push_back({id, 0, 0});
  return all;
}

// Note [A look in one call] (store/store_ops.cpp): one round trip per key.
std::optional<std::string> look(c10d::Store& store, const std::string& key) {
  auto value = store::look(store, key);
  if (!value) return std::nullopt;
  return util::from_bytes(*value);
}

}  // namespace

// Note [Arrivals in buckets]
// A scan of quorum t reads every arrival. One key per replica made that N round
// trips, one after another, on the decision's critical path: on a busy machine,
// where each round trip waits for the store's thread to be scheduled, 1,024
// replicas took seconds to decide. So each arrival is also appended to the bucket
// of kArrivalsPerBucket replicas its id falls in, with compareSet (the append of
// c10d's extended API is not in LibTorch 1.13), and a scan reads N / 32 keys. An
// append that loses a race retries on the value it lost to, so it costs the
// arrival a round trip per concurrent arrival of its bucket, off the critical
// path. A replica that arrives twice (a stale incarnation, then its replacement)
// has two entries; the later one counts. The key of its own (keys::arrived) stays,
// for the waits that follow one replica's arrival.
void announce_arrival(c10d::Store& store, std::int64_t target, const Member& me) {
  store.set(keys::arrived(target, me.id), util::to_bytes(fmt::format("{} {}", me.incarnation, me.step)));
  store::append_bytes(store, keys::arrivals(target, me.id / kArrivalsPerBucket),
                      util::to_bytes(fmt::format("{} {} {};", me.id, me.incarnation, me.step)));
}

namespace {

// The deaths the launcher published, read from the event log incrementally.
class DeathLog {
 public:
  // Reads the events up to the store's count. An event counted but not yet written
  // is looked at again at later calls, and given up after kEventGrace (Note [An
  // event that never comes] in replica_group.cpp).
  void catch_up(c10d::Store& store) {
    const auto total = store.add(keys::events(), 0);
    for (auto n = seen_ + 1; n <= total; ++n) pending_.emplace(n, Clock::now());
    seen_ = std::max(seen_, total);
    for (auto it = pending_.begin(); it != pending_.end();) {
      const auto text = look(store, keys::event(it->first));
      if (!text && Clock::now() - it->second < kEventGrace) {
        ++it;
        continue;
      }
      if (text) record(*text);
      it = pending_.erase(it);
    }
  }
  // Events counted so far, and whether any was.
  std::int64_t events() const { return seen_; }
  bool any() const { return seen_ > 0; }
  bool is_dead(const Member& m) const {
    const auto it = dead_.find(m.id);
    return it != dead_.end() && it->second >= m.incarnation;
  }

 private:
  static constexpr auto kEventGrace = std::chrono::seconds(2);

  void record(const std::string& text) {
    std::istringstream in(text);
    std::string what;
    int rank = -1, incarnation = -1;
    if (!(in >> what >> rank >> incarnation) || what != "dead") return;
    const auto it = dead_.find(rank);
    dead_[rank] = it == dead_.end() ? incarnation : std::max(it->second, incarnation);
  }

  std::int64_t seen_ = 0;
  std::map<std::int64_t, Clock::time_point> pending_;  // counted, text not yet read
  std::map<int, int> dead_;
};

// What a scan of quorum `target` found (Note [How a quorum forms at scale]).
struct Scan {
  std::map<int, Member> arrived;  // not published dead (Note [Published dead is out])
  std::vector<int> missing;       // expected, not arrived, not dead
  std::size_t dead = 0;           // expected members published dead
};

Scan scan(c10d::Store& store, std::int64_t target, const std::vector<Member>& expected, int max_replicas,
          const DeathLog& deaths) {
  Scan found;
  const int buckets = (max_replicas + kArrivalsPerBucket - 1) / kArrivalsPerBucket;
  for (int b = 0; b < buckets; ++b) {
    const auto text = look(store, keys::arrivals(target, b));
    if (!text) continue;
    std::istringstream in(*text);
    Member m;
    char end = 0;
    while (in >> m.id >> m.incarnation >> m.step >> end) {
      if (deaths.is_dead(m))
        found.arrived.erase(m.id);
      else
        found.arrived[m.id] = m;  // a later entry of the same replica replaces the earlier
    }
  }
  for (const auto& m : expected) {
    const bool is_dead = deaths.is_dead(m);
    found.dead += is_dead;
    if (!found.arrived.count(m.id) && !is_dead) found.missing.push_back(m.id);
  }
  return found;
}

// Note [Sharding inside a replica]: the arrivals whose replica has arrived whole.
std::map<int, Member> whole_replicas(const std::map<int, Member>& arrived, int shards) {
  if (shards == 1) return arrived;
  std::map<int, int> present;
  for (const auto& entry : arrived) ++present[entry.first / shards];
  std::map<int, Member> whole;
  for (const auto& [id, m] : arrived)
    if (present[id / shards] == shards) whole[id] = m;
  return whole;
}

std::int64_t top_step(const std::map<int, Member>& members) {
  std::int64_t top = -1;
  for (const auto& entry : members) top = std::max(top, entry.second.step);
  return top;
}

}  // namespace

// Note [Published dead is out]
// The launcher publishes a worker dead when it reaps it, and the agent hosting the
// store publishes the workers of a node it lost (Note [A lost slot's ranks are
// published dead] in launcher/in_process.h). A node can be lost while its workers
// live on: its agent stopped (SIGSTOP), or cut off. Such a worker used to go on
// arriving under its replica's id beside the newcomer that took its place, and the
// two overwrote each other's arrival every quorum: quorums re-formed almost every
// step, and the two ran as the same replica (found by review). So an arrival whose
// incarnation is published dead is never taken into a quorum, and a worker that
// finds itself published dead stops with a CommError that says so: its agent, if it
// is alive, replaces it with a higher incarnation, as for any death.
namespace {
void throw_if_published_dead(c10d::Store& store, const Member& me, std::int64_t target) {
  const auto dead = dead_incarnation(store, me.id);
  if (dead < me.incarnation) return;
  throw CommError(fmt::format("cohort: fault tolerance: replica {} (incarnation {}) was published dead (up to "
                              "incarnation {}) while it came to quorum {}: the launcher lost its node (its agent "
                              "stopped answering) and the others go on without it; it leaves the job\n  fix: none "
                              "needed here; a live agent replaces this worker with a new incarnation",
                              me.id, me.incarnation, dead, target));
}
}  // namespace

namespace {

// Note [How a quorum forms at scale]
// Note [How a quorum forms] says who may decide and on what; this says who looks,
// and when, so that a quorum of N replicas costs the store O(N) calls, not O(N^2).
// Before, every replica polled every 0.2-2 ms, and each poll checked the dead key of
// every expected member and re-read every arrival when the count moved: 8 replicas
// formed in 8 ms, 64 in 0.45 s, 256 in 7.3 s (4N^2 calls; docs/scale.md).
//  - A replica waits on the store for the decision (a server-side wait in slices,
//    or a poll of check() over c10d's TCPStore), and between slices reads two
//    counters: the arrivals of this quorum and the job's death events. Deaths are
//    read from the event log (cohort/ft/event/<n>, written by the launcher beside
//    each dead key; Note [An event that never comes]), each event once, so a
//    replica knows how many expected members can no longer come.
//  - Only when the arrivals reach the expected members still alive, or the wait
//    for the expected has run out, is a scan worth its N reads. The situation
//    (arrivals, events, deadline, member or joiner) names a claim key; the first
//    replica to add to it scans and decides (or finds it cannot yet), the others
//    wait for the decision. The arrival that completes the count claims at once,
//    so the common quorum costs one scan and a decision broadcast by the store.
//  - A scan reads each key in one round trip (Note [A look in one call]), and no
//    dead key at all in a job where nobody died yet.
//  - A scanner that dies mid-scan is a death: the events move, so does the
//    situation, and another replica claims it. An event whose text never comes is
//    not counted; the deadline still brings a scan.
//  - A quorum that cannot form for want of a shard's state is published as such
//    (a members record that starts with '!'), so every replica stops with the
//    scanner's error, not only the scanner.

// How long a replica waits on the store for the decision between looks at the
// counters: the watcher (the quorum's first arrival) looks often; the others, which
// only stand in for a watcher that died, look less often the more they are, so
// that their looks together cost the store about the same.
std::chrono::milliseconds slice_for(int replicas, bool watcher) {
  if (watcher) return std::chrono::milliseconds(1);
  return std::chrono::milliseconds(std::clamp(replicas / 4, 20, 250));
}

[[noreturn]] void throw_timed_out(const Scan& found, std::int64_t target, const Member& me, const FormRules& rules,
                                  bool may_decide, std::chrono::steady_clock::duration waited) {
  if (!may_decide)
    throw TimeoutError(
        fmt::format("cohort: fault tolerance: replica {} waited {:.0f} s to join quorum {}, but no live replica "
                    "came to take it in (they do at their next step boundary)\n  fix: are the others hung in a "
                    "step longer than that? raise COHORT_FT_MIN_REPLICAS_TIMEOUT",
                    me.id, std::chrono::duration<double>(waited).count(), target),
        "fault-tolerant join", {});
  const auto whole = whole_replicas(found.arrived, rules.shards_per_replica);
  const auto replicas_here = static_cast<int>(whole.size()) / rules.shards_per_replica;
  std::vector<int> here;
  for (const auto& entry : found.arrived) here.push_back(entry.first);
  QuorumRecord proposal;
  for (const auto& entry : whole) proposal.members.push_back(entry.second);
  const bool keeps_newest = top_step(whole) >= top_step(found.arrived);
  const int unsourced = proposal.shard_without_source(rules.shards_per_replica);
  if (replicas_here >= rules.min_replicas && (!keeps_newest || unsourced >= 0))
    throw TimeoutError(
        fmt::format("cohort: fault tolerance: quorum {} cannot form after {:.0f} s: ranks [{}] arrived, but the "
                    "newest state (step {}) of some shard is held only by ranks whose replica of {} is not "
                    "whole; [{}] are missing (dead or stopped)\n  fix: see why those ranks died (the launcher's "
                    "log); the job resumes from its newest checkpoint when restarted",
                    target, std::chrono::duration<double>(waited).count(), fmt::join(here, ", "),
                    top_step(found.arrived), rules.shards_per_replica, fmt::join(found.missing, ", ")),
        "fault-tolerant quorum", found.missing);
  const bool ranks = rules.shards_per_replica > 1;
  throw TimeoutError(
      fmt::format("cohort: fault tolerance: quorum {} has {} of the {} {}replicas it needs (--min-replicas) after "
                  "{:.0f} s: {} [{}] are here, [{}] are missing (dead or stopped)\n  fix: see why those "
                  "{} died (the launcher's log), or lower --min-replicas",
                  target, replicas_here, rules.min_replicas, ranks ? "whole " : "",
                  std::chrono::duration<double>(waited).count(), ranks ? "ranks" : "replicas", fmt::join(here, ", "),
                  fmt::join(found.missing, ", "), ranks ? "ranks" : "replicas"),
      "fault-tolerant quorum", found.missing);
}

// One look at quorum `target` by the replica that claimed it: decides it (writes
// the members) when Note [How a quorum forms]'s rules allow, else leaves it.
void look_and_decide(c10d::Store& store, std::int64_t target, const std::vector<Member>& expected, bool was_member,
                     const FormRules& rules, const DeathLog& deaths, bool waited_enough) {
  const auto found = scan(store, target, expected, rules.max_replicas, deaths);
  const auto whole = whole_replicas(found.arrived, rules.shards_per_replica);
  const auto replicas_here = static_cast<int>(whole.size()) / rules.shards_per_replica;
  const bool enough = replicas_here >= rules.min_replicas;
  const bool may_decide = was_member || found.dead == expected.size();  // Note [Who may decide]
  if (!may_decide || !enough) return;
  // Note [Sharding inside a replica]: never leave out the newest state. A rank that
  // holds a later step than every whole replica here waits for its replica to be
  // whole (its missing rank arrives, or dies and is replaced).
  // And every shard of the proposal has a source at its newest step: a rank of a
  // shard may arrive late, stuck in a collective with a rank that failed.
  const bool keeps_newest = top_step(whole) >= top_step(found.arrived);
  QuorumRecord proposal;
  proposal.id = target;
  for (const auto& entry : whole) proposal.members.push_back(entry.second);
  const int unsourced = proposal.shard_without_source(rules.shards_per_replica);
  // A rank that holds it may have arrived in a replica not yet whole (its dead
  // rank's replacement is still starting): then waiting can still give a source.
  QuorumRecord everyone;
  for (const auto& entry : found.arrived) everyone.members.push_back(entry.second);
  const bool holder_here = unsourced >= 0 && everyone.max_step() == proposal.max_step() &&
                           everyone.source_of(unsourced, rules.shards_per_replica) >= 0;
  const auto members_key = keys::members(target);
  if (keeps_newest && unsourced >= 0 && !holder_here && found.missing.empty() && waited_enough) {
    // Every member of the last quorum is here or dead, a rank left out of it (it
    // comes to every quorum) had the deadline to arrive, and no rank here holds
    // that shard: nobody who could give it is coming, and its state is lost.
    const auto why = fmt::format("cohort: fault tolerance: quorum {} cannot form: no rank holds shard {} of the "
                                 "newest state (step {}); every rank that held it was lost before its replica was "
                                 "whole again (Note [Sharding inside a replica])\n  fix: restart the job; it "
                                 "resumes from its newest checkpoint on disk",
                                 target, unsourced, proposal.max_step());
    store.compareSet(members_key, {}, util::to_bytes("!" + why));  // Note [How a quorum forms at scale]
    return;
  }
  if (keeps_newest && unsourced < 0 && (found.missing.empty() || waited_enough)) {
    proposal.join_requests = store.add(keys::join_requests(), 0);
    store.compareSet(members_key, {}, util::to_bytes(proposal.encode()));
  }
}

}  // namespace

QuorumRecord form_quorum(c10d::Store& store, std::int64_t target, const Member& me, const FormRules& rules,
                         const std::function<void()>& on_arrived) {
  throw_if_published_dead(store, me, target);
  const auto members_key = keys::members(target);
  announce_arrival(store, target, me);
  const auto count_key = keys::quorum(target) + "/count";
  auto count = store.add(count_key, 1);
  if (on_arrived) on_arrived();
  const auto expected = expected_members(store, target, rules.max_replicas);
  // Note [Who may decide]
  const bool was_member = std::any_of(expected.begin(), expected.end(), [&](const Member& m) {
    return m.id == me.id && m.incarnation == me.incarnation;
  });
  const auto start = Clock::now();
  const bool watcher = count == 1;
  const auto slice = slice_for(rules.max_replicas, watcher);
  DeathLog deaths;
  std::string last_claim;
  for (std::int64_t looks = 0;; ++looks) {
    // Note [How a quorum forms at scale]
    deaths.catch_up(store);
    const auto live_expected = std::count_if(expected.begin(), expected.end(),
                                             [&](const Member& m) { return !deaths.is_dead(m); });
    const auto waited = Clock::now() - start;
    const bool waited_enough = waited >= rules.wait_for_expected;
    if (count >= live_expected || waited_enough) {
      const auto claim = fmt::format("{}/look/{}.{}.{}{}", keys::quorum(target), count, deaths.events(),
                                     waited_enough ? 1 : 0, was_member ? "m" : "j");
      if (claim != last_claim) {
        last_claim = claim;
        if (store.add(claim, 1) == 1)
          look_and_decide(store, target, expected, was_member, rules, deaths, waited_enough);
      }
    }
    if (looks > 0 ? store::wait_for_key(store, members_key, slice, std::min<std::chrono::microseconds>(slice, std::chrono::milliseconds(2)))
                  : store.check({members_key}))
      break;
    if (!was_member || looks % (watcher ? 64 : 4) == 3) {
      if (store.check({keys::finished()})) {
        const auto step = std::stoll(util::from_bytes(store.get(keys::finished())));
        throw TrainingFinished(fmt::format("cohort: fault tolerance: replica {} came to join quorum {}, but "
                                           "training finished at step {}; there is nothing left to do",
                                           me.id, target, step),
                               step);
      }
      throw_if_published_dead(store, me, target);
    }
    if (Clock::now() - start >= rules.wait_for_expected + rules.below_minimum) {
      if (store.check({members_key})) break;
      deaths.catch_up(store);
      const auto found = scan(store, target, expected, rules.max_replicas, deaths);
      throw_timed_out(found, target, me, rules, was_member || found.dead == expected.size(),
                      Clock::now() - start);
    }
    count = store.add(count_key, 0);
  }
  auto record = QuorumRecord::decode(target, util::from_bytes(store.get(members_key)));
  store.set(keys::latest(), util::to_bytes(std::to_string(target)));
  return record;
}

}  // namespace cohort::fault_tolerance
