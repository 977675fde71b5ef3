#pragma once
// Who publishes a lost node's ranks dead, and when (Note [A lost slot's ranks are
// published dead] in in_process.h).
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cohort/elastic/dynamic_rendezvous.h"
#include "cohort/launcher/in_process.h"
#include "cohort/launcher/round_end.h"

namespace cohort::launcher {

// Whether this agent publishes the job's vacant slots now: the agent hosting the
// store; under etcd, the participant in the lowest slot (Note [Who publishes a
// vacant slot under etcd]).
bool keeps_slots(const elastic::RendezvousState& s, const std::string& node, StoreRole role);

// Note [A lost slot's ranks are published dead], by the agent hosting the store.
//
// Note [Who publishes a vacant slot under etcd]
// No agent hosts an etcd job's store, and any agent may be lost, so the duty goes
// with the record: the live participant in the lowest slot publishes, and when it
// is lost itself the next lowest takes over once the record drops it. Two agents
// that read the record at different times may both publish a slot; a death
// published twice is the same keys written twice.
class VacantSlots {
 public:
  VacantSlots(InProcessRestarts& restarts, elastic::DynamicRendezvous& rdzv, const elastic::Round& r,
              std::vector<int> sizes, StoreRole role)
      : restarts_(restarts), rdzv_(rdzv), round_(r.round), sizes_(std::move(sizes)), role_(role) {}

  // Publishes each slot of round r that the record `s` shows vacant, once, while
  // this agent keeps the slots (keeps_slots); a slot taken again is published
  // again when it is next lost.
  void look(const elastic::RendezvousState& s);

 private:
  InProcessRestarts& restarts_;
  elastic::DynamicRendezvous& rdzv_;
  std::int64_t round_;
  std::vector<int> sizes_;
  StoreRole role_;
  std::set<int> published_;
};

}  // namespace cohort::launcher
