#include "cohort/elastic/rendezvous_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cohort/errors.h"
#include "cohort/util/json_integer.h"

namespace cohort::elastic {
namespace {

void mark_complete(RendezvousState& state) {
  state.complete = true;
  state.last_call.reset();
  int rank = 0;
  for (auto& [node, r] : state.participants) r = rank++;  // std::map: sorted by name
  state.slots = state.held ? rank : 0;
}

// After a participant is gone (it left, or its heartbeats stopped).
void after_participant_removed(RendezvousState& state, const RendezvousSettings& settings) {
  if (state.complete) {
    if (state.participants.empty()) {
      // Everyone has left the finished round: the next one opens, and the nodes on
      // the wait list join it like anyone else.
      state.complete = false;
      state.done.clear();
      state.slots = 0;
      ++state.round;
    }
  } else if (static_cast<int>(state.participants.size()) < settings.min_nodes()) {
    state.last_call.reset();
  }
}

// Note [rdzv-conf ranges]: every duration is a finite number of seconds, > 0 and at
// most a week (as --join-timeout), taken to the millisecond rounding up, so none
// becomes 0 or overflows a deadline. keep_alive_interval is at least
// kMinKeepAliveInterval: every heartbeat is a write to the store that wakes each
// waiting agent, and below that a node on a busy host is declared dead between two of
// its own beats.
Millis seconds(const std::string& key, const std::string& value, double at_least = 0) {
  std::size_t used = 0;
  double s = 0;
  try {
    s = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty()) {
    throw ConfigError(fmt::format("--rdzv-conf {}={}: not a number of seconds", key, value));
  }
  if (!(s > 0)) {
    throw ConfigError(fmt::format("--rdzv-conf {}={}: must be positive (c10d took 0 to mean \"wait forever\"; "
                                  "cohort bounds every wait)",
                                  key, value));
  }
  constexpr double kWeek = 7 * 24 * 3600.0;
  if (!(s <= kWeek)) {
    throw ConfigError(fmt::format("--rdzv-conf {}={}: at most a week ({} s); cohort bounds every wait, give a "
                                  "finite number of seconds",
                                  key, value, static_cast<long>(kWeek)));
  }
  if (s < at_least) {
    throw ConfigError(fmt::format("--rdzv-conf {}={}: at least {} s (every heartbeat is a write to the store; "
                                  "torchrun's default is 5)",
                                  key, value, at_least));
  }
  return Millis(static_cast<std::int64_t>(std::ceil(s * 1000.0)));
}

int positive_count(const std::string& key, const std::string& value) {
  if (value.empty() || value.size() > 6 || !std::all_of(value.begin(), value.end(), ::isdigit) || std::stoi(value) < 1) {
    throw ConfigError(fmt::format("--rdzv-conf {}={}: must be a whole number of at least 1", key, value));
  }
  return std::stoi(value);
}

// "a=1,b=2" as (key, value) pairs; empty items are skipped.
std::vector<std::pair<std::string, std::string>> conf_items(const std::string& conf) {
  std::vector<std::pair<std::string, std::string>> out;
  std::stringstream items(conf);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos)
      throw ConfigError(fmt::format("--rdzv-conf {}: write KEY=VALUE pairs separated by commas", item));
    out.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  return out;
}

}  // namespace

RendezvousSettings parse_rdzv_conf(const std::string& conf, RendezvousSettings base) {
  for (const auto& [key, value] : conf_items(conf)) {
    const std::string item = key + "=" + value;
    if (key == "join_timeout") {
      base.join_timeout(seconds(key, value));
    } else if (key == "last_call_timeout") {
      base.last_call_timeout(seconds(key, value));
    } else if (key == "close_timeout") {
      base.close_timeout(seconds(key, value));
    } else if (key == "keep_alive_interval") {
      base.keep_alive_interval(seconds(key, value, kMinKeepAliveInterval));
    } else if (key == "keep_alive_max_heartbeats" || key == "keep_alive_max_attempt") {
      base.keep_alive_max_missed(positive_count(key, value));
    } else if (key == "worker_store") {
      if (value != "cohort" && value != "tcpstore")
        throw ConfigError(fmt::format("--rdzv-conf {}: worker_store is 'cohort' (the authenticated store, the "
                                      "default) or 'tcpstore' (a plain c10d TCPStore for stock c10d workers)",
                                      item));
      base.worker_store(value == "cohort" ? WorkerStore::kCohort : WorkerStore::kTcpStore);
    } else {
      throw ConfigError(fmt::format("--rdzv-conf {}: unknown key '{}'; known: join_timeout, last_call_timeout, "
                                    "close_timeout, keep_alive_interval, keep_alive_max_heartbeats, worker_store",
                                    item, key));
    }
  }
  return base;
}

std::vector<std::pair<std::string, std::string>> rdzv_conf_items(const std::string& conf) { return conf_items(conf); }

std::vector<std::string> rdzv_conf_keys(const std::string& conf) {
  std::vector<std::string> keys;
  for (const auto& item : conf_items(conf)) keys.push_back(item.first);
  return keys;
}

bool RendezvousState::operator==(const RendezvousState& o) const {
  return round == o.round && complete == o.complete && closed == o.closed && last_call == o.last_call &&
         participants == o.participants && wait_list == o.wait_list && heartbeats == o.heartbeats &&
         beats == o.beats && restarts == o.restarts && max_restarts == o.max_restarts &&
         min_nodes == o.min_nodes && max_nodes == o.max_nodes && failed_round == o.failed_round && done == o.done &&
         held == o.held && slots == o.slots && joins_folded == o.joins_folded;
}

const char* to_string(JoinAction action) {
  switch (action) {
    case JoinAction::kAddToParticipants: return "add to participants";
    case JoinAction::kAddToWaitList: return "add to wait list";
    case JoinAction::kTakeSlot: return "take a vacant slot";
    case JoinAction::kMarkComplete: return "mark complete";
    case JoinAction::kWait: return "wait";
    case JoinAction::kFinish: return "finish";
    case JoinAction::kRemoveSelf: return "remove self";
    case JoinAction::kErrorTimeout: return "timeout";
    case JoinAction::kErrorClosed: return "closed";
  }
  return "?";
}

JoinAction next_join_action(const RendezvousState& state, const std::string& node, Millis now, bool join_expired,
                            const RendezvousSettings& settings) {
  if (state.closed) return JoinAction::kErrorClosed;
  const bool participant = state.participants.count(node) > 0;
  const bool waiting = state.wait_list.count(node) > 0;
  if (state.complete && participant) return JoinAction::kFinish;
  if (join_expired) return participant || waiting ? JoinAction::kRemoveSelf : JoinAction::kErrorTimeout;
  // Note [Held rounds]: a vacant slot is taken, unless the job is finishing.
  if (state.complete && state.held && state.done.empty() && vacant_slot(state) >= 0) return JoinAction::kTakeSlot;
  if (state.complete) {
    // Too late for this round: wait for the next, if there will be room in it.
    if (!waiting && static_cast<int>(state.participants.size() + state.wait_list.size()) < settings.max_nodes()) {
      return JoinAction::kAddToWaitList;
    }
    return JoinAction::kWait;
  }
  if (participant) {
    const bool enough = static_cast<int>(state.participants.size()) >= settings.min_nodes();
    return enough && state.last_call && now >= *state.last_call ? JoinAction::kMarkComplete : JoinAction::kWait;
  }
  return static_cast<int>(state.participants.size()) < settings.max_nodes() ? JoinAction::kAddToParticipants
                                                                              : JoinAction::kWait;
}

void apply(RendezvousState& state, JoinAction action, const std::string& node, Millis now,
           const RendezvousSettings& settings) {
  switch (action) {
    case JoinAction::kAddToParticipants: {
      state.wait_list.erase(node);
      state.participants[node] = -1;
      state.heartbeats[node] = ++state.beats;
      const auto n = static_cast<int>(state.participants.size());
      if (n == settings.max_nodes()) {
        mark_complete(state);
      } else if (n >= settings.min_nodes() && !state.last_call) {
        state.last_call = now + settings.last_call_timeout();
      }
      return;
    }
    case JoinAction::kAddToWaitList:
      state.wait_list.insert(node);
      state.heartbeats[node] = ++state.beats;
      return;
    case JoinAction::kTakeSlot:
      state.wait_list.erase(node);
      state.participants[node] = vacant_slot(state);
      state.heartbeats[node] = ++state.beats;
      return;
    case JoinAction::kMarkComplete:
      mark_complete(state);
      return;
    case JoinAction::kRemoveSelf:
      leave(state, node, settings);
      return;
    default:
      return;  // kWait, kFinish and the errors change nothing
  }
}

void leave(RendezvousState& state, const std::string& node, const RendezvousSettings& settings) {
  state.heartbeats.erase(node);
  if (state.wait_list.erase(node) > 0) return;
  if (state.participants.erase(node) > 0) after_participant_removed(state, settings);
}

void heartbeat(RendezvousState& state, const std::string& node) {
  if (state.participants.count(node) > 0 || state.wait_list.count(node) > 0) state.heartbeats[node] = ++state.beats;
}

void HeartbeatWatch::observe(const RendezvousState& state, Millis now, Millis blind_after) {
  if (last_look_ && now - *last_look_ > blind_after)  // Note [A blind observer]
    for (auto& [node, seen] : seen_) seen.since += now - *last_look_;
  last_look_ = now;
  for (auto it = seen_.begin(); it != seen_.end();)
    it = state.heartbeats.count(it->first) ? std::next(it) : seen_.erase(it);  // gone: forget it
  for (const auto& [node, beat] : state.heartbeats) {
    auto it = seen_.find(node);
    if (it == seen_.end() || it->second.beat != beat) seen_[node] = Seen{beat, now};
  }
}

std::vector<std::string> HeartbeatWatch::silent(Millis now, Millis bound) const {
  std::vector<std::string> out;
  for (const auto& [node, seen] : seen_)
    if (now - seen.since > bound) out.push_back(node);
  return out;
}

Millis blind_after(const RendezvousSettings& settings) { return settings.keep_alive_interval() * 2; }

std::vector<std::string> drop_dead_nodes(RendezvousState& state, HeartbeatWatch& watch, Millis now,
                                         const RendezvousSettings& settings) {
  watch.observe(state, now, blind_after(settings));
  const auto dead = watch.silent(now, settings.keep_alive_interval() * settings.keep_alive_max_missed());
  for (const auto& node : dead) leave(state, node, settings);
  return dead;
}

std::int64_t adopt_max_restarts(RendezvousState& state, int mine) {
  if (state.max_restarts < 0) state.max_restarts = mine;
  return state.max_restarts;
}

bool adopt_held(RendezvousState& state, bool mine) {
  if (state.max_nodes <= 0) state.held = mine;
  return state.held;
}

bool slot_taken(const RendezvousState& state, int slot) {
  return std::any_of(state.participants.begin(), state.participants.end(),
                     [&](const auto& participant) { return participant.second == slot; });
}

int vacant_slot(const RendezvousState& state) {
  if (!state.complete || !state.held) return -1;
  for (int slot = 0; slot < state.slots; ++slot)
    if (!slot_taken(state, slot)) return slot;
  return -1;
}

std::pair<int, int> adopt_nnodes(RendezvousState& state, int min_nodes, int max_nodes) {
  if (state.max_nodes <= 0) {
    state.min_nodes = min_nodes;
    state.max_nodes = max_nodes;
  }
  return {state.min_nodes, state.max_nodes};
}

std::string nnodes_text(int min_nodes, int max_nodes) {
  return min_nodes == max_nodes ? std::to_string(max_nodes) : fmt::format("{}:{}", min_nodes, max_nodes);
}

bool count_failure(RendezvousState& state, std::int64_t round) {
  if (state.failed_round >= round) return true;  // another node counted it already
  if (state.restarts >= std::max<std::int64_t>(state.max_restarts, 0)) return false;
  ++state.restarts;
  state.failed_round = round;
  return true;
}

bool waiters_care(const RendezvousState& before, const RendezvousState& after) {
  return before.round != after.round || before.complete != after.complete || before.closed != after.closed ||
         before.last_call != after.last_call || before.wait_list != after.wait_list ||
         before.done != after.done || (vacant_slot(after) >= 0 && vacant_slot(before) != vacant_slot(after));
}

int nodes_waiting(const RendezvousState& state) { return static_cast<int>(state.wait_list.size()); }

std::string encode(const RendezvousState& s) {
  nlohmann::json j = {{"round", s.round},
                      {"complete", s.complete},
                      {"closed", s.closed},
                      {"participants", s.participants},
                      {"wait_list", s.wait_list},
                      {"restarts", s.restarts},
                      {"max_restarts", s.max_restarts},
                      {"min_nodes", s.min_nodes},
                      {"max_nodes", s.max_nodes},
                      {"beats", s.beats},
                      {"failed_round", s.failed_round},
                      {"done", s.done},
                      {"held", s.held},
                      {"slots", s.slots},
                      {"joins_folded", s.joins_folded}};
  j["last_call"] = s.last_call ? nlohmann::json(s.last_call->count()) : nlohmann::json(nullptr);
  j["heartbeats"] = s.heartbeats;
  return j.dump();
}

RendezvousState decode(const std::string& bytes) {
  try {
    const auto j = nlohmann::json::parse(bytes);
    RendezvousState s;
    s.round = util::json_integer_at<std::int64_t>(j, "round");
    s.complete = j.at("complete").get<bool>();
    s.closed = j.at("closed").get<bool>();
    // Note [Integers from JSON]: the record comes from the store, which anyone can write.
    for (const auto& [node, slot] : j.at("participants").items())
      s.participants[node] = util::json_integer<int>(slot, "participants." + node);
    s.wait_list = j.at("wait_list").get<std::set<std::string>>();
    s.restarts = util::json_integer_at<std::int64_t>(j, "restarts");
    s.max_restarts = util::json_integer_at<std::int64_t>(j, "max_restarts");
    s.min_nodes = util::json_integer_at<int>(j, "min_nodes");
    s.max_nodes = util::json_integer_at<int>(j, "max_nodes");
    s.beats = util::json_integer_at<std::int64_t>(j, "beats");
    s.failed_round = util::json_integer_at<std::int64_t>(j, "failed_round");
    s.done = j.at("done").get<std::set<std::string>>();
    s.held = j.at("held").get<bool>();
    s.slots = util::json_integer_at<int>(j, "slots");
    s.joins_folded = util::json_integer_or<std::int64_t>(j, "joins_folded", 0);
    if (!j.at("last_call").is_null()) s.last_call = Millis(util::json_integer_at<std::int64_t>(j, "last_call"));
    for (const auto& [node, beat] : j.at("heartbeats").items())
      s.heartbeats[node] = util::json_integer<std::int64_t>(beat, "heartbeats." + node);
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("the rendezvous record in the store is not one cohort wrote ({}); is another "
                                "job using the same --rdzv-id?",
                                e.what()));
  }
}

}  // namespace cohort::elastic
