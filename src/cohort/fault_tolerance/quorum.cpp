#include "cohort/fault_tolerance/quorum.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <thread>

#include "cohort/errors.h"
#include "cohort/util/bytes.h"

namespace cohort::fault_tolerance {

namespace keys {
std::string quorum(std::int64_t id) { return "cohort/ft/q" + std::to_string(id); }
std::string members(std::int64_t id) { return quorum(id) + "/members"; }
std::string arrived(std::int64_t id, int replica) { return quorum(id) + "/arrived/" + std::to_string(replica); }
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

std::map<int, Member> read_arrivals(c10d::Store& store, std::int64_t target, int max_replicas) {
  std::map<int, Member> found;
  for (int id = 0; id < max_replicas; ++id) {
    const auto key = keys::arrived(target, id);
    if (!store.check({key})) continue;
    Member m;
    m.id = id;
    std::istringstream in(util::from_bytes(store.get(key)));
    in >> m.incarnation >> m.step;
    if (dead_incarnation(store, id) >= m.incarnation) continue;  // Note [Published dead is out]
    found[id] = m;
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

QuorumRecord form_quorum(c10d::Store& store, std::int64_t target, const Member& me, const FormRules& rules,
                         const std::function<void()>& on_arrived) {
  throw_if_published_dead(store, me, target);
  const auto members_key = keys::members(target);
  store.set(keys::arrived(target, me.id), util::to_bytes(fmt::format("{} {}", me.incarnation, me.step)));
  const auto count_key = keys::quorum(target) + "/count";
  store.add(count_key, 1);
  if (on_arrived) on_arrived();
  const auto expected = expected_members(store, target, rules.max_replicas);
  // Note [Who may decide]
  const bool was_member = std::any_of(expected.begin(), expected.end(), [&](const Member& m) {
    return m.id == me.id && m.incarnation == me.incarnation;
  });
  const auto start = Clock::now();
  std::int64_t seen_count = -1;
  std::map<int, Member> arrived;
  auto pause = std::chrono::microseconds(200);
  while (!store.check({members_key})) {
    if (store.check({keys::finished()})) {
      const auto step = std::stoll(util::from_bytes(store.get(keys::finished())));
      throw TrainingFinished(fmt::format("cohort: fault tolerance: replica {} came to join quorum {}, but training "
                                         "finished at step {}; there is nothing left to do",
                                         me.id, target, step),
                             step);
    }
    const auto count = store.add(count_key, 0);
    if (count != seen_count) {
      throw_if_published_dead(store, me, target);
      arrived = read_arrivals(store, target, rules.max_replicas);
      seen_count = count;
    }
    std::vector<int> missing;
    size_t dead = 0;
    for (const auto& m : expected) {
      const bool is_dead = dead_incarnation(store, m.id) >= m.incarnation;
      dead += is_dead;
      if (!arrived.count(m.id) && !is_dead) missing.push_back(m.id);
    }
    const auto waited = Clock::now() - start;
    const auto whole = whole_replicas(arrived, rules.shards_per_replica);
    const auto replicas_here = static_cast<int>(whole.size()) / rules.shards_per_replica;
    const bool enough = replicas_here >= rules.min_replicas;
    const bool may_decide = was_member || dead == expected.size();
    // Note [Sharding inside a replica]: never leave out the newest state. A rank that
    // holds a later step than every whole replica here waits for its replica to be
    // whole (its missing rank arrives, or dies and is replaced).
    // And every shard of the proposal has a source at its newest step: a rank of a
    // shard may arrive late, stuck in a collective with a rank that failed.
    const bool keeps_newest = top_step(whole) >= top_step(arrived);
    QuorumRecord proposal;
    proposal.id = target;
    for (auto& [id, m] : whole) proposal.members.push_back(m);
    const int unsourced = proposal.shard_without_source(rules.shards_per_replica);
    // A rank that holds it may have arrived in a replica not yet whole (its dead
    // rank's replacement is still starting): then waiting can still give a source.
    QuorumRecord everyone;
    for (auto& [id, m] : arrived) everyone.members.push_back(m);
    const bool holder_here = unsourced >= 0 && everyone.max_step() == proposal.max_step() &&
                             everyone.source_of(unsourced, rules.shards_per_replica) >= 0;
    if (may_decide && enough && keeps_newest && unsourced >= 0 && !holder_here && missing.empty() &&
        waited >= rules.wait_for_expected)
      // Every member of the last quorum is here or dead, a rank left out of it (it
      // comes to every quorum) had the deadline to arrive, and no rank here holds
      // that shard: nobody who could give it is coming, and its state is lost.
      throw CommError(fmt::format("cohort: fault tolerance: quorum {} cannot form: no rank holds shard {} of the "
                                  "newest state (step {}); every rank that held it was lost before its replica was "
                                  "whole again (Note [Sharding inside a replica])\n  fix: restart the job; it "
                                  "resumes from its newest checkpoint on disk",
                                  target, unsourced, proposal.max_step()));
    if (may_decide && enough && keeps_newest && unsourced < 0 &&
        (missing.empty() || waited >= rules.wait_for_expected)) {
      proposal.join_requests = store.add(keys::join_requests(), 0);
      store.compareSet(members_key, {}, util::to_bytes(proposal.encode()));
      break;
    }
    if (waited >= rules.wait_for_expected + rules.below_minimum) {
      if (!may_decide)
        throw TimeoutError(
            fmt::format("cohort: fault tolerance: replica {} waited {:.0f} s to join quorum {}, but no live replica "
                        "came to take it in (they do at their next step boundary)\n  fix: are the others hung in a "
                        "step longer than that? raise COHORT_FT_MIN_REPLICAS_TIMEOUT",
                        me.id, std::chrono::duration<double>(waited).count(), target),
            "fault-tolerant join", {});
      std::vector<int> here;
      for (auto& [id, m] : arrived) here.push_back(id);
      if (enough && (!keeps_newest || unsourced >= 0))
        throw TimeoutError(
            fmt::format("cohort: fault tolerance: quorum {} cannot form after {:.0f} s: ranks [{}] arrived, but the "
                        "newest state (step {}) of some shard is held only by ranks whose replica of {} is not "
                        "whole; [{}] are "
                        "missing (dead or stopped)\n  fix: see why those ranks died (the launcher's log); the job "
                        "resumes from its newest checkpoint when restarted",
                        target, std::chrono::duration<double>(waited).count(), fmt::join(here, ", "),
                        top_step(arrived), rules.shards_per_replica, fmt::join(missing, ", ")),
            "fault-tolerant quorum", missing);
      const bool ranks = rules.shards_per_replica > 1;
      throw TimeoutError(
          fmt::format("cohort: fault tolerance: quorum {} has {} of the {} {}replicas it needs (--min-replicas) after "
                      "{:.0f} s: {} [{}] are here, [{}] are missing (dead or stopped)\n  fix: see why those "
                      "{} died (the launcher's log), or lower --min-replicas",
                      target, replicas_here, rules.min_replicas, ranks ? "whole " : "",
                      std::chrono::duration<double>(waited).count(), ranks ? "ranks" : "replicas",
                      fmt::join(here, ", "), fmt::join(missing, ", "), ranks ? "ranks" : "replicas"),
          "fault-tolerant quorum", missing);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
  auto record = QuorumRecord::decode(target, util::from_bytes(store.get(members_key)));
  store.set(keys::latest(), util::to_bytes(std::to_string(target)));
  return record;
}

}  // namespace cohort::fault_tolerance
