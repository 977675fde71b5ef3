#include "cohort/fault_tolerance/replica_group.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <limits>
#include <sstream>

#include "cohort/comm/rendezvous.h"
#include "cohort/errors.h"
#include "cohort/store/store_wait.h"
#include "cohort/fault_tolerance/transfer.h"
#include "cohort/fault_tolerance/vote.h"
#include "cohort/util/bytes.h"
#include "cohort/util/parse.h"

namespace cohort::fault_tolerance {

using Clock = std::chrono::steady_clock;

std::vector<int> Quorum::replica_ids() const {
  std::vector<int> ids;
  for (const auto& m : members) ids.push_back(m.id);
  return ids;
}

// Note [Hearing of a death]
// `cohort run --fault-tolerance in-process` writes cohort/ft/event/<n> ("dead <id>
// <incarnation>") the moment it reaps a worker. Each replica's watcher thread waits
// for the next event on a connection of its own, remembers the death, and aborts
// the vote its replica is in (if the dead one is a member), so the survivors do not
// wait out quorum_timeout for a vote that will never come. end_step() registers its
// vote under the same lock and aborts at once when a member is already known dead:
// a death heard just before the vote is not missed either. A kill -9 during a
// collective needs no help: the peer's sockets close and Gloo fails the
// collective at once; the watcher matters for a death between collectives.
//
// Note [An event that never comes]
// An agent numbers an event with add() and writes it with set() just after. An
// agent that dies between the two leaves a number whose event never appears, and a
// watcher that waited for it would hear no later death (found by reading). So once
// the counter has passed the awaited number and the event is still missing after
// kMissingEventGrace (the set follows the add within microseconds on a live agent),
// the watcher skips that number.
namespace {

constexpr auto kMissingEventGrace = std::chrono::seconds(2);


struct Death {
  int id;
  int incarnation;
};

bool member_dead(const std::vector<Member>& members, const std::vector<Death>& deaths) {
  for (const auto& d : deaths)
    for (const auto& m : members)
      if (m.id == d.id && m.incarnation <= d.incarnation) return true;
  return false;
}

}  // namespace

struct WatchState {
  std::mutex mu;
  std::vector<std::string> votes;  // what a member's death aborts
  std::vector<Member> members;
  std::vector<Death> deaths;
  std::atomic<bool> stop{false};
  std::thread thread;
};

namespace {

void run_watcher(WatchState& w, c10d::Store& store) {
  std::int64_t next = 0;
  try {
    next = store.add(keys::events(), 0) + 1;
  } catch (const std::exception&) {
    return;  // no store: the collectives' own failures still abort steps
  }
  auto missing_since = std::chrono::steady_clock::time_point::max();  // Note [An event that never comes]
  while (!w.stop.load()) {
    const auto key = keys::event(next);
    try {
      // Note [A wait that runs out over c10d's TCPStore]
      if (!store::wait_for_key(store, key, std::chrono::milliseconds(250), std::chrono::milliseconds(10))) {
        if (store.add(keys::events(), 0) < next) continue;  // not numbered yet
        const auto now = std::chrono::steady_clock::now();
        if (missing_since == std::chrono::steady_clock::time_point::max()) missing_since = now;
        if (now - missing_since >= kMissingEventGrace) {
          ++next;  // its agent died between add and set
          missing_since = std::chrono::steady_clock::time_point::max();
        }
        continue;
      }
    } catch (const std::exception&) {
      return;  // no store: the collectives' own failures still abort steps
    }
    missing_since = std::chrono::steady_clock::time_point::max();
    std::string text;
    try {
      text = util::from_bytes(store.get(key));
    } catch (const std::exception&) {
      return;
    }
    ++next;
    std::istringstream in(text);
    std::string what;
    Death d{-1, -1};
    if (!(in >> what >> d.id >> d.incarnation) || what != "dead") continue;
    std::lock_guard<std::mutex> lock(w.mu);
    w.deaths.push_back(d);
    if (!member_dead(w.members, {d})) continue;
    for (const auto& vote : w.votes) {
      try {
        abort_vote(store, vote);
      } catch (const std::exception&) {
      }
    }
  }
}

// COHORT_FT_INCARNATION, which cohort run sets: a whole number >= 0, strictly.
int incarnation_from(const comm::EnvMap& env) {
  auto it = env.find("COHORT_FT_INCARNATION");
  if (it == env.end() || it->second.empty()) return 0;
  const long value = util::parse_long(it->second, "COHORT_FT_INCARNATION");
  if (value < 0 || value > std::numeric_limits<int>::max())
    throw ConfigError(fmt::format("COHORT_FT_INCARNATION: '{}' is out of range; cohort run sets it (0, 1, ...)",
                                  it->second));
  return static_cast<int>(value);
}

}  // namespace

ReplicaGroup ReplicaGroup::join(ReplicaGroupOptions options) {
  const auto env = comm::process_environment();
  const auto info = comm::world_info_from(env);
  auto mode = env.count("COHORT_FAULT_TOLERANCE") ? env.at("COHORT_FAULT_TOLERANCE") : std::string();
  if (info.world_size == 1 && info.master_addr.empty()) {
    auto store = c10::make_intrusive<c10d::HashStore>();
    return ReplicaGroup(store, store, 0, 1, 0, std::move(options));
  }
  if (mode != "in-process" || !info.use_agent_store)
    throw ConfigError(
        "cohort: ReplicaGroup::join needs `cohort run --fault-tolerance in-process`: the store must outlive any "
        "worker and the launcher must restart only the dead one (this process was started " +
        std::string(info.use_agent_store ? "by cohort run without --fault-tolerance in-process" : "by another launcher") +
        ")\n  fix: cohort run --fault-tolerance in-process --nproc-per-node N PROGRAM");
  const int incarnation = incarnation_from(env);  // bad input is named before anything connects
  auto init = comm::InitOptions::from_env(env);
  auto store = comm::make_world_store(info, init);
  auto watch_store = comm::connect_again(info, store, init.join_timeout());
  return ReplicaGroup(std::move(store), std::move(watch_store), info.rank, info.world_size, incarnation,
                      std::move(options));
}

ReplicaGroup::ReplicaGroup(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Store> watch_store,
                           int replica_id, int max_replicas, int incarnation, ReplicaGroupOptions options)
    : store_(std::move(store)),
      watch_store_(std::move(watch_store)),
      id_(replica_id),
      max_replicas_(max_replicas),
      incarnation_(incarnation),
      options_(std::move(options)),
      fresh_(incarnation > 0),
      watch_(std::make_unique<WatchState>()) {
  options_.validate();
  const int k = options_.shards_per_replica();
  if (max_replicas_ % k != 0)
    throw ConfigError(fmt::format("cohort: fault tolerance: {} ranks cannot make replicas of {} ranks each "
                                  "(ReplicaGroupOptions::shards_per_replica)\n  fix: start a multiple of {} workers, "
                                  "or change the shards per replica",
                                  max_replicas_, k, k));
  if (options_.min_replicas() > max_replicas_ / k)
    throw ConfigError(fmt::format("cohort: fault tolerance: --min-replicas {} is more than the {} replicas started; "
                                  "lower it or start more workers",
                                  options_.min_replicas(), max_replicas_ / k));
  watch_->thread = std::thread([w = watch_.get(), s = watch_store_] { run_watcher(*w, *s); });
}

ReplicaGroup::ReplicaGroup(ReplicaGroup&&) noexcept = default;

ReplicaGroup::~ReplicaGroup() {
  if (!watch_) return;  // moved from
  watch_->stop = true;
  if (watch_->thread.joinable()) watch_->thread.join();
}

void ReplicaGroup::on_transfer(std::function<void(std::ostream&)> save, std::function<void(std::istream&)> load) {
  save_ = std::move(save);
  load_ = std::move(load);
}

void ReplicaGroup::resume_at(std::int64_t step) {
  if (!quorum_ || !quorum_->fresh_start || step_ != 0 || step < 0)
    throw ConfigError(fmt::format("cohort: ReplicaGroup::resume_at({}) on replica {}: only right after a begin_step() "
                                  "whose quorum is fresh_start (no replica had trained), before any end_step()",
                                  step, id_));
  step_ = step;
}

void ReplicaGroup::discard_state() {
  fresh_ = true;
  need_regroup_ = true;
}

void ReplicaGroup::finish() { store_->set(keys::finished(), util::to_bytes(std::to_string(step_))); }

const Quorum& ReplicaGroup::begin_step() {
  if (quorum_ && !need_regroup_) {
    if (!abandoned_.empty()) release_settled_groups();
    quorum_->changed = false;
    return *quorum_;
  }
  regroup();
  return *quorum_;
}

std::string ReplicaGroup::step_vote() const { return fmt::format("{}/s{}", keys::quorum(quorum_->id), step_); }

void ReplicaGroup::set_watched(std::vector<std::string> votes, const std::vector<Member>& members) {
  std::lock_guard<std::mutex> lock(watch_->mu);
  watch_->votes = std::move(votes);
  watch_->members = members;
}

bool ReplicaGroup::end_step(bool ok) {
  TORCH_CHECK(quorum_.has_value(), "ReplicaGroup::end_step() without begin_step()");
  const auto name = step_vote();
  {
    std::lock_guard<std::mutex> lock(watch_->mu);
    watch_->votes = {name};
    if (member_dead(quorum_->members, watch_->deaths)) ok = false;  // Note [Hearing of a death]
  }
  // Note [Joining at a step boundary]
  // A replica that wants in bumps join_requests after it has arrived at the next
  // quorum. The member whose vote completes a step compares the counter with the
  // value the current quorum was formed at; when it grew, the decision is
  // commit-and-regroup, so every member forms the next quorum after this step, at
  // the same step boundary, and the joiner is in it.
  auto joiners_waiting = [&] { return store_->add(keys::join_requests(), 0) > join_requests_seen_; };
  VoteResult result;
  try {
    result = vote(*store_, name, quorum_->size, ok, options_.quorum_timeout(), joiners_waiting);
  } catch (const std::exception& e) {
    set_watched({}, quorum_->members);
    throw CommError(fmt::format("cohort: fault tolerance: replica {} lost the job's store while voting on step {}: "
                                "{}\n  fix: the store lives in `cohort run` on node 0; is it still running?",
                                id_, step_, e.what()));
  }
  set_watched({}, quorum_->members);
  switch (result.decision) {
    case Decision::kCommitAndRegroup:
      need_regroup_ = true;
      [[fallthrough]];
    case Decision::kCommit:
      forget_committed_vote(name);
      ++step_;
      return true;
    case Decision::kAbort:
      break;
  }
  need_regroup_ = true;
  ++stats_.aborted_steps;
  return false;
}

// Note [Forgetting committed votes]
// Each step leaves three keys in the job's store (its vote count, decision and
// wake-up key), so a long run would grow the store by millions of keys. Once step
// s is committed, every member has voted on s, and so has read the decision of
// its vote before, when that was in the same quorum: no member can read it again,
// and each member deletes it (deleting twice is harmless). Across a quorum change
// the earlier vote is kept: a member of the old quorum left out of the new one (a
// stopped replica that resumes) may still be about to read it. The watcher aborts
// only the vote in progress. The votes kept, aborted ones included, and each
// quorum's own keys are one per failure or join, not one per step.
void ReplicaGroup::forget_committed_vote(const std::string& name) {
  if (!committed_vote_.empty() && committed_quorum_ == quorum_->id) {
    try {
      forget_vote(*store_, committed_vote_);
    } catch (const std::exception&) {
      // A store that fails here fails the next vote too, which says so.
    }
  }
  committed_vote_ = name;
  committed_quorum_ = quorum_->id;
}

// Note [One configuration]
// Replicas started with different settings (another --steps or --batch-size on one
// node) would train on: the sampler would split different global batches, or one
// replica would find training finished before its own last step and exit as if it
// had succeeded. So replica 0's configuration is the job's: it writes it (set) before
// its first quorum, and every other replica, replacements included, waits for it
// (bounded by start_timeout, as the first quorum is) and compares its own before it
// joins a quorum. A mismatch is a ConfigError on that replica, which leaves the
// others training. Not "the first to arrive": that refused the right replicas
// whenever the odd one happened to start first (seen in CI). Replica 0 runs on
// node 0, which holds the store, so the job cannot outlive it unwritten. Replica 0
// writes it only if it is not there yet (compareSet): a replica 0 that is a
// replacement, started with other settings, is refused like any other, rather than
// changing the job's configuration under the replicas that train on. It then sets
// the same text again: c10d's TCPStore wakes no waiter on a compareSet (Note
// [Waking the waiters]), and the other replicas wait on this key.
void ReplicaGroup::check_configuration() {
  auto mine = options_.configuration();
  if (options_.shards_per_replica() > 1)  // every rank must cut the replicas alike
    mine += fmt::format(" (shards per replica {})", options_.shards_per_replica());
  const auto key = keys::configuration();
  if (id_ == 0) {
    const auto theirs = util::from_bytes(store_->compareSet(key, {}, util::to_bytes(mine)));
    if (theirs != mine)
      throw ConfigError(fmt::format("cohort: fault tolerance: replica 0 runs with configuration \"{}\", but the job "
                                    "was started with \"{}\" (replica 0's first start), which the other replicas "
                                    "train with\n  fix: restart replica 0 with the job's settings (on node 0, the "
                                    "same program arguments as the other nodes)",
                                    mine, theirs));
    store_->set(key, util::to_bytes(mine));
    return;
  }
  std::string failure = "it did not";
  try {
    // Note [A wait that runs out over c10d's TCPStore]
    if (store::wait_for_key(*store_, key, options_.start_timeout(), std::chrono::milliseconds(50))) failure.clear();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!failure.empty())
    throw TimeoutError(fmt::format("cohort: fault tolerance: replica {} waited {:.0f} s for replica 0 to publish the "
                                   "job's configuration: {}\n  fix: check that replica 0 (node 0's first worker) "
                                   "started, or raise ReplicaGroupOptions::start_timeout",
                                   id_, std::chrono::duration<double>(options_.start_timeout()).count(), failure),
                       "configuration", {0});
  const auto theirs = util::from_bytes(store_->get(key));
  if (theirs != mine)
    throw ConfigError(fmt::format("cohort: fault tolerance: replica {} runs with configuration \"{}\", but replica 0, "
                                  "whose settings are the job's, runs with \"{}\"\n  fix: start every replica with "
                                  "the same settings (on every node, the same program arguments)",
                                  id_, mine, theirs));
}

void ReplicaGroup::regroup() {
  if (!quorum_) check_configuration();  // Note [One configuration]
  const auto started = Clock::now();
  // Survivors go to the next quorum together; a replica outside the last quorum
  // (a joiner, or one that was dropped) goes to the first one not yet decided.
  std::int64_t target = quorum_ ? quorum_->id + 1 : 1;
  if (fresh_ || !quorum_) {
    std::int64_t hint = 1;
    if (store_->check({keys::latest()})) {
      hint = std::stoll(util::from_bytes(store_->get(keys::latest())));
      // Note [A late first arrival joins]
      // A first incarnation that finds a quorum already decided was not in it: it
      // arrived after the job began (its node's agent was started again after the
      // node vanished, or it was slow to start). It has no state worth keeping, so
      // it joins as a replacement does: at the next undecided quorum, asking in
      // after it arrives, and taking the state from a live replica.
      if (!quorum_) fresh_ = true;
    }
    if (fresh_) target = next_undecided(*store_, hint);
  }
  for (;;) {
    switch (try_quorum(target)) {
      case Outcome::kIn:
        stats_.last_regroup_seconds = std::chrono::duration<double>(Clock::now() - started).count();
        ++stats_.quorums;
        need_regroup_ = false;
        return;
      case Outcome::kOut:
      case Outcome::kFailed:
        break;
    }
    target = next_undecided(*store_, target + 1);
  }
}

// Note [Abandoned groups]
// A group left for a new quorum is not destroyed at once: a collective of it may
// still be stuck on a stopped peer until collective_timeout, and destroying Gloo's
// backend waits for its work, which would stall the survivors' regroup. It is kept
// until collective_timeout (and a second of grace) has passed since it was left;
// by then each of its collectives has finished or failed, so destroying it is
// quick. Then it goes, with its Gloo threads, sockets and its arrival board's
// publisher thread and store connection: a long job that regroups often holds only
// the groups of the last collective_timeout, not one per regroup since it started.
void ReplicaGroup::abandon_group() {
  release_settled_groups();
  if (world_) abandoned_.push_back({std::move(*world_), std::move(subgroups_), Clock::now()});
  world_.reset();
  subgroups_.clear();
  stats_.groups_held = static_cast<std::int64_t>(abandoned_.size());
}

// Note [Sharding inside a replica] (quorum.h): members are whole replicas in id
// order, so member i is shard i % k of the quorum's replica i / k. Every member
// makes every subgroup's new_group call in the same order (World::new_group).
void ReplicaGroup::build_subgroups(Quorum& q) {
  const int k = options_.shards_per_replica();
  q.shard = q.rank % k;
  q.replicas = q.size / k;
  if (k == 1) return;
  for (int r = 0; r < q.replicas; ++r) {
    std::vector<int> ranks;
    for (int j = 0; j < k; ++j) ranks.push_back(r * k + j);
    auto g = world_->new_group(ranks);
    if (r == q.rank / k) q.shard_group = g;
    subgroups_.push_back(std::move(g));
  }
  for (int j = 0; j < k; ++j) {
    std::vector<int> ranks;
    for (int r = 0; r < q.replicas; ++r) ranks.push_back(r * k + j);
    auto g = world_->new_group(ranks);
    if (j == q.shard) q.peer_group = g;
    subgroups_.push_back(std::move(g));
  }
}

void ReplicaGroup::release_settled_groups() {
  const auto settled = options_.collective_timeout() + std::chrono::seconds(1);
  const auto now = Clock::now();
  while (!abandoned_.empty() && now - abandoned_.front().since > settled) abandoned_.pop_front();
  stats_.groups_held = static_cast<std::int64_t>(abandoned_.size());
}

namespace {

// Note [Gloo's rendezvous waits with the store's timeout]
// Building a quorum's group, Gloo's full-mesh rendezvous reads each peer's address
// with a plain get(), which waits for the key as long as the store's own timeout
// (the job's join timeout: many minutes), not InitOptions::join_timeout. A member
// stopped (SIGSTOP) right after it arrived resumes after the others gave up on that
// quorum, and reads the address of a peer that never wrote it: it hung for as long
// (found by review, with one rank per replica too). The members formed the quorum
// together, so each address is there within quorum_timeout or never; for the
// build, the store's timeout is quorum_timeout. The wait that runs out then fails
// the group like a dead member, and the quorum's vote aborts. Over LibTorch 1.13's
// TCPStore such a wait also breaks this connection (Note [A wait that runs out over
// c10d's TCPStore]): the member then loses the store, exits, and is replaced; bounded
// either way.
class StoreTimeout {
 public:
  StoreTimeout(c10d::Store& store, std::chrono::milliseconds timeout) : store_(store), old_(store.getTimeout()) {
    store_.setTimeout(timeout);
  }
  ~StoreTimeout() {
    try {
      store_.setTimeout(old_);
    } catch (const std::exception&) {
    }
  }
  StoreTimeout(const StoreTimeout&) = delete;
  StoreTimeout& operator=(const StoreTimeout&) = delete;

 private:
  c10d::Store& store_;
  std::chrono::milliseconds old_;
};

}  // namespace

ReplicaGroup::Outcome ReplicaGroup::try_quorum(std::int64_t target) {
  Member me{id_, incarnation_, fresh_ ? -1 : step_};
  FormRules rules;
  rules.max_replicas = max_replicas_;
  rules.min_replicas = options_.min_replicas();
  rules.shards_per_replica = options_.shards_per_replica();
  rules.wait_for_expected = target == 1 ? options_.start_timeout() : options_.quorum_timeout();
  rules.below_minimum = options_.min_replicas_timeout();
  auto event = [&](const char* what) {
    if (options_.on_event()) options_.on_event()(fmt::format("{} q{}", what, target));
  };
  // Note [Joining at a step boundary]: a replica outside the last quorum asks in
  // once it has arrived.
  const bool joining = fresh_ || (quorum_ && quorum_->id != target - 1);
  const auto record = form_quorum(*store_, target, me, rules, [&] {
    if (joining) store_->add(keys::join_requests(), 1);
    event("arrived");
  });
  event("decided");
  const int index = record.index_of(id_);
  if (index < 0) {
    // Note [Joining at a step boundary]: ask the members to take this replica in.
    store_->add(keys::join_requests(), 1);
    return Outcome::kOut;
  }
  const int size = static_cast<int>(record.members.size());
  abandon_group();
  bool ok = true;
  Quorum q;
  q.id = target;
  q.members = record.members;
  q.rank = index;
  q.size = size;
  try {
    const StoreTimeout bounded(*store_, options_.quorum_timeout());  // Note [Gloo's rendezvous waits with ...]
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(keys::quorum(target), store_);
    world_ = comm::World::init_with_store(prefixed, index, size,
                                          comm::InitOptions()
                                              .backend(options_.backend())
                                              .timeout(options_.collective_timeout())
                                              .join_timeout(options_.quorum_timeout()));
    build_subgroups(q);
  } catch (const std::exception&) {
    ok = false;  // a member died while the group formed: the vote below aborts it
  }
  {
    std::lock_guard<std::mutex> lock(watch_->mu);
    watch_->votes = {keys::quorum(target) + "/formed"};
    watch_->members = record.members;
    if (member_dead(record.members, watch_->deaths)) ok = false;
  }
  if (vote(*store_, keys::quorum(target) + "/formed", size, ok, options_.quorum_timeout()).decision == Decision::kAbort)
    return Outcome::kFailed;
  event("formed");
  const bool behind = std::any_of(record.members.begin(), record.members.end(),
                                  [&](const Member& m) { return m.step < record.max_step(); });
  const int k = options_.shards_per_replica();
  if (behind && record.shard_without_source(k) >= 0) {
    // form_quorum decides no such quorum; a record written otherwise stops every
    // member alike.
    const int lost = record.shard_without_source(k);
    throw CommError(fmt::format("cohort: fault tolerance: {} cannot train: no live rank holds shard {} of the state "
                                "at step {} (every rank that held it was lost before its replica was whole again; "
                                "Note [Sharding inside a replica])\n  fix: restart the job; it resumes from its "
                                "newest checkpoint on disk",
                                record.describe(), lost, record.max_step()));
  }
  if (behind) {
    bool sent_ok = true;
    try {
      if (index == record.source_of(id_ % k, k)) event("sending");
      if (record.members[static_cast<size_t>(index)].step < record.max_step()) event("receiving");
      auto result = transfer_state(world_->group(), record, index, step_, save_, load_, k);
      if (result.received) {
        step_ = result.step;
        ++stats_.transfers_received;
      }
      stats_.transfers_sent += result.sent;
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception&) {
      sent_ok = false;
    }
    {
      std::lock_guard<std::mutex> lock(watch_->mu);
      watch_->votes = {keys::quorum(target) + "/transferred"};
      if (member_dead(record.members, watch_->deaths)) sent_ok = false;
    }
    if (vote(*store_, keys::quorum(target) + "/transferred", size, sent_ok, options_.collective_timeout()).decision ==
        Decision::kAbort)
      return Outcome::kFailed;
  }
  if (record.max_step() < 0) step_ = 0;  // Note [Who may decide]: nobody had state
  set_watched({}, record.members);
  fresh_ = false;
  join_requests_seen_ = record.join_requests;
  q.group = world_->group();
  if (k == 1) q.peer_group = q.group;
  q.changed = true;
  q.fresh_start = record.max_step() <= 0;
  quorum_ = std::move(q);
  event("joined");
  return Outcome::kIn;
}

}  // namespace cohort::fault_tolerance
