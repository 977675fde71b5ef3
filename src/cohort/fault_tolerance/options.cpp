#include "cohort/fault_tolerance/options.h"

#include <fmt/format.h>

#include "cohort/errors.h"
#include "cohort/util/parse.h"

namespace cohort::fault_tolerance {

ReplicaGroupOptions ReplicaGroupOptions::from_env(const comm::EnvMap& env) {
  ReplicaGroupOptions o;
  auto get = [&](const char* name) -> const std::string* {
    auto it = env.find(name);
    return it == env.end() || it->second.empty() ? nullptr : &it->second;
  };
  auto seconds = [](const std::string& text, const char* name) {
    return util::timeout_from_seconds(util::parse_seconds(text, name), name);
  };
  if (auto v = get("COHORT_FT_MIN_REPLICAS")) {
    try {
      std::size_t used = 0;
      o.min_replicas(std::stoi(*v, &used));
      if (used != v->size()) throw std::invalid_argument("trailing characters");
    } catch (const std::exception&) {
      throw ConfigError(fmt::format("COHORT_FT_MIN_REPLICAS=\"{}\" is not a whole number; give e.g. 2 (cohort run "
                                    "--min-replicas sets it)",
                                    *v));
    }
  }
  if (auto v = get("COHORT_FT_COLLECTIVE_TIMEOUT")) o.collective_timeout(seconds(*v, "COHORT_FT_COLLECTIVE_TIMEOUT"));
  if (auto v = get("COHORT_FT_QUORUM_TIMEOUT")) o.quorum_timeout(seconds(*v, "COHORT_FT_QUORUM_TIMEOUT"));
  if (auto v = get("COHORT_FT_MIN_REPLICAS_TIMEOUT"))
    o.min_replicas_timeout(seconds(*v, "COHORT_FT_MIN_REPLICAS_TIMEOUT"));
  o.validate();
  return o;
}

void ReplicaGroupOptions::validate() const {
  if (min_replicas_ < 1)
    throw ConfigError(fmt::format("ReplicaGroupOptions::min_replicas is {}; it must be at least 1", min_replicas_));
  if (shards_per_replica_ < 1)
    throw ConfigError(
        fmt::format("ReplicaGroupOptions::shards_per_replica is {}; it must be at least 1", shards_per_replica_));
  auto positive = [](std::chrono::milliseconds d, const char* name) {
    if (d.count() <= 0)
      throw ConfigError(fmt::format("ReplicaGroupOptions::{} is {} ms; every deadline must be > 0", name, d.count()));
  };
  positive(collective_timeout_, "collective_timeout");
  positive(quorum_timeout_, "quorum_timeout");
  positive(start_timeout_, "start_timeout");
  positive(min_replicas_timeout_, "min_replicas_timeout");
}

}  // namespace cohort::fault_tolerance
