#pragma once
// An optimizer whose state is spread over the ranks (zero::ShardedOptimizer) can be
// saved shard by shard: each rank writes the state of the parameters it owns, and
// nothing is gathered anywhere. Checkpointer::save does so with
// CheckpointerOptions::shard_optimizer_state(true) (Note [Sharded checkpoints] in
// checkpoint/checkpointer_save.cpp); load_latest reshards at any world size.
#include <functional>
#include <string>
#include <vector>

namespace cohort::checkpoint {

// Who held which parameter's state when a sharded checkpoint was written: the
// parameters are the optimizer's, in its order, each counted once.
struct ShardLayout {
  int world_size = 0;
  std::vector<int> owner;  // owner[i]: the rank whose shard holds parameter i's state
};

class SavesStateInShards {
 public:
  virtual ~SavesStateInShards() = default;
  // The layout of this optimizer now (the same on every rank).
  virtual ShardLayout shard_layout() const = 0;
  // This rank's shard in the wrapped optimizer's own format (an optimizer over the
  // parameters this rank owns, in order); empty when it owns none.
  virtual std::string shard_bytes() const = 0;
  // Takes back this rank's share of a state saved under `saved` (any world size):
  // shard(k) returns the bytes of the saved shard k, verified, and is asked only for
  // the shards that hold a parameter this rank owns now. Local: no collective.
  virtual void load_shards(const ShardLayout& saved, const std::function<std::string(int)>& shard) = 0;
};

}  // namespace cohort::checkpoint
