#pragma once
// Settings that every rank must share, compared across the world at start. A rank
// started with another --tp, --seed or --zero than its peers would otherwise hang in
// a collective of another shape until the timeout, or train silently to a model that
// no one setting gives. Each rank lists the settings that shape the job, as text, and
// calls agree_on_settings right after World::init, before any collective those
// settings shape:
//
//   auto world = cohort::comm::World::init();
//   cohort::comm::agree_on_settings(world, {{"--tp", std::to_string(tp)},
//                                           {"--seed", std::to_string(seed)}});
//
// On a difference every rank throws the same cohort::ConfigError, naming each setting
// that differs, its values and the ranks that hold each:
//
//   cohort: the ranks were started with different settings: --tp differs across
//   ranks: 2 on ranks 0,2; 4 on rank 1. Pass the same flags to every rank ...
//
// Leave out what may differ per rank: paths that only rank 0 writes, its log
// interval, a path to a copy of the data that each node keeps where it likes (list
// what the data is instead, e.g. its size). README.md, "Settings every rank shares".
#include <string>
#include <utility>
#include <vector>

namespace cohort::comm {

class World;

// A setting and its value as text: {"--tp", "2"}.
using Setting = std::pair<std::string, std::string>;

// Collective over the world's group: every rank calls it once at the same point, with
// its own settings. Returns when every rank holds the same list; else throws
// cohort::ConfigError on every rank (the message of describe_disagreement). Two small
// all-gathers when the ranks agree (each rank's length and hash), a third of the text
// when they do not; bounded by the group's timeout. The text is at most
// kMaxSettingsBytes per rank.
void agree_on_settings(const World& world, const std::vector<Setting>& settings);

inline constexpr std::size_t kMaxSettingsBytes = std::size_t{1} << 20;

// Pure: what differs among `by_rank` (the settings of each rank, `ranks[i]` the rank
// that holds by_rank[i]), as the ConfigError's message; "" when they agree. A setting
// that a rank does not list is "(not set)" there.
std::string describe_disagreement(const std::vector<std::vector<Setting>>& by_rank, const std::vector<int>& ranks);

}  // namespace cohort::comm
