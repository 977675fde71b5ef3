#include "cohort/launcher/vacant_slots.h"

namespace cohort::launcher {

using elastic::RendezvousState;

bool keeps_slots(const RendezvousState& s, const std::string& node, StoreRole role) {
  if (role != StoreRole::kReplicated) return role == StoreRole::kHost;
  int lowest = -1;
  std::string keeper;
  for (const auto& [name, slot] : s.participants)
    if (slot >= 0 && (lowest < 0 || slot < lowest)) {
      lowest = slot;
      keeper = name;
    }
  return keeper == node;
}

void VacantSlots::look(const RendezvousState& s) {
  if (s.round != round_ || !s.complete || !keeps_slots(s, rdzv_.node(), role_)) return;
  int first_rank = 0;
  for (int slot = 0; slot < static_cast<int>(sizes_.size()); ++slot) {
    const int count = sizes_[static_cast<std::size_t>(slot)];
    const int first = first_rank;
    first_rank += count;
    if (elastic::slot_taken(s, slot)) {
      published_.erase(slot);  // taken again: a later loss is published again
    } else if (!published_.count(slot)) {
      const bool published = restarts_.publish_lost_slot(slot, first, count, [&] {
        const auto now = rdzv_.read();
        return now.round == round_ && !elastic::slot_taken(now, slot);
      });
      if (published) published_.insert(slot);
    }
  }
}

}  // namespace cohort::launcher
