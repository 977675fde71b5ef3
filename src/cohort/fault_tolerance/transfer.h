#pragma once
// Note [Live transfer]
// A replica that joins a quorum behind the others (a replacement with no state, or
// one that was stopped while they trained on) takes the state of a live member over
// the quorum's own group, not from disk. The source is the lowest-id member at the
// quorum's highest step; every member behind it receives, in rank order: a header
// (format, step) and the bytes the user's save function wrote (model, optimizer,
// RNG: what the step count does not give; the sampler's position is the step).
// Members at the highest step neither send nor receive. A failure on either side
// aborts the quorum through its vote, and the survivors form the next one.
// With shards_per_replica k > 1 (Note [Sharding inside a replica] in quorum.h) the
// state differs by shard: a member of shard j (its id modulo k) receives from the
// lowest-id member of shard j at the highest step, so one transfer has up to k
// sources at once, each sending its own shard of the optimizer state.
#include <cstdint>
#include <functional>
#include <iosfwd>

#include "cohort/comm/group.h"
#include "cohort/fault_tolerance/quorum.h"

namespace cohort::fault_tolerance {

struct TransferResult {
  bool received = false;
  std::int64_t step = 0;  // the source's step, when received
  std::int64_t sent = 0;  // receivers served, on the source
  std::int64_t bytes = 0;
};

// Collective over `group` (the quorum `record`, where this replica is `index`).
// Throws ConfigError when a transfer is due and `save` (on the source) or `load`
// (on a receiver) is missing, CommError/TimeoutError when a peer fails.
TransferResult transfer_state(comm::Group& group, const QuorumRecord& record, int index, std::int64_t step,
                              const std::function<void(std::ostream&)>& save,
                              const std::function<void(std::istream&)>& load, int shards_per_replica = 1);

}  // namespace cohort::fault_tolerance
