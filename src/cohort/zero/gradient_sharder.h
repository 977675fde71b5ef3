#pragma once
// ZeRO stage 2's gradients: each parameter's gradient is reduced to the rank that
// owns the parameter (zero/partition.h) and lives there alone. ShardedOptimizer
// makes one when ShardedOptimizerOptions::shard_gradients is on; users do not build
// it themselves, and the model is then not wrapped in DDP.
//
// Note [ZeRO-2 gradients]
// A pre-hook on each trainable parameter's AccumulateGrad node takes the gradient
// before autograd accumulates it, so autograd never writes .grad during a
// synchronised backward. Buckets follow DDP's first plan (ddp/bucket_plan.h: reverse
// registration order, launched strictly in plan order on every rank, Note [Bucket
// ready order]). A bucket holds one flat tensor per owner of its parameters, made
// when its first gradient arrives; each gradient is written into its owner's flat
// divided by the world size (the same multiplication as DDP's, Note [Divide on the
// way in]) and dropped, so a gradient outlives its arrival only inside a flat. A full
// bucket sends each flat by a reduce (a sum) to its owner: one c10d reduce per owner
// and bucket, which is a reduce-scatter with uneven shards. Gloo in LibTorch 1.13 has no reduce_scatter,
// and c10d's average over Gloo is a sum in some versions, so it is a sum of divided
// values on every backend. The owner's .grad becomes its share of the result,
// aliasing the received tensor (no copy); the other ranks keep no gradient of it.
// At most two buckets are in flight: launching a third first lands the oldest, so
// gradients in transit take about three buckets at most (two sent, one filling).
//
// Accumulation follows DDP: a parameter's .grad after a synchronised backward is
// what it held before (an earlier average not yet cleared by zero_grad) plus this
// backward's average. Under no_sync, autograd accumulates into .grad locally as
// usual (full size on every rank), and the next synchronised backward sends that
// local sum together with its own gradient. An owner whose .grad still holds an
// earlier average when no_sync begins refuses it (that average would be divided and
// summed again, and a later zero_grad could not tell it from the local sum):
// zero_grad() first, as every accumulation loop does.
//
// A parameter that receives no gradient in a synchronised backward (unused in this
// forward, on this rank) contributes zeros, so every rank launches every bucket.
//
// Note [Unused parameters under ZeRO-2]
// A parameter that no rank used must be skipped by the optimizer, as one process
// skips a parameter whose .grad is undefined (weight decay and Adam's moments would
// otherwise move it); one that some rank used has the average on its owner, as DDP
// with find_unused_parameters gives. The ranks agree without another collective:
// each owner's flat carries one more element per parameter after the gradients,
// 1 where this rank has a gradient for it (this backward's or a no_sync sum) and 0
// where not, and the same reduce sums these votes. The owner adds the average to
// .grad only where the sum is above zero; elsewhere .grad stays as it was (undefined
// if it was, or zero_grad()'s zeros, exactly as in one process).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "cohort/compat/autograd.h"
#include "cohort/comm/group.h"
#include "cohort/ddp/bucket_plan.h"

namespace torch::autograd {
struct Node;
}

namespace cohort::zero {

class GradientSharder {
 public:
  // `params` each once, `owners[i]` the group rank that owns params[i]. Parameters
  // that do not require grad are left alone. Every rank must pass the same.
  GradientSharder(std::vector<at::Tensor> params, std::vector<int> owners, comm::Group group,
                  std::int64_t bucket_cap_bytes);
  ~GradientSharder();
  GradientSharder(const GradientSharder&) = delete;
  GradientSharder& operator=(const GradientSharder&) = delete;

  // While false (no_sync), backward accumulates into .grad locally and sends nothing.
  void set_sync(bool sync);
  bool sync() const;

  // Throws ConfigError when a parameter this rank does not own holds a gradient
  // that this sharder did not leave there (the model is also under DDP, say).
  // Also refuses a step while a backward's reduction is unfinished.
  void check_before_step();

  // Bytes of gradient this rank holds (.grad of every parameter).
  std::int64_t local_gradient_bytes() const;
  // Buckets of the plan (for tests and docs).
  std::size_t buckets() const { return plan_.buckets.size(); }

  // Called by the pre-hooks and at the end of backward.
  at::Tensor take(std::size_t k, const at::Tensor& incoming);
  void finalize_backward();

 private:
  // One owner's part of a bucket: its parameters and where each starts in the flat.
  struct OwnerSlice {
    int owner = 0;
    std::vector<std::size_t> members;  // indexes into trainable_
    std::vector<std::int64_t> offsets;
    std::int64_t numel = 0;
  };
  struct InFlight {
    std::size_t bucket = 0;
    std::size_t slice = 0;  // into layout_[bucket]
    at::Tensor flat;        // the divided gradients; on the owner, once landed, their sum
    comm::Pending pending;
  };
  at::Tensor& param(std::size_t k) { return params_[trainable_[k]]; }
  int owner(std::size_t k) const { return owners_[trainable_[k]]; }
  void arm();
  // Writes (a + b) / world into parameter k's place in its bucket; either may be
  // undefined (zeros when both are).
  void fill(std::size_t k, const at::Tensor& a, const at::Tensor& b);
  void mark_ready(std::size_t k);
  void launch_ready_buckets();
  void launch(std::size_t bucket);
  void land(InFlight& f);
  void reset_iteration();
  void drop_abandoned_backward();  // Note [An abandoned backward]

  std::vector<at::Tensor> params_;
  std::vector<int> owners_;
  comm::Group group_;
  std::vector<std::size_t> trainable_;  // indexes of the parameters that require grad
  ddp::BucketPlan plan_;                 // over trainable_
  std::vector<std::vector<OwnerSlice>> layout_;  // per bucket, owners ascending
  std::vector<std::pair<std::size_t, std::size_t>> place_;  // per parameter: its slice and position there
  at::Tensor inverse_world_;            // 1 / world size, a 0-dim double tensor (as DDP's)
  std::vector<compat::NodePtr> accumulators_;
  std::vector<const void*> hook_keys_;

  mutable std::mutex mutex_;
  bool sync_ = true;
  bool armed_ = false;  // a synchronised backward is under way
  std::weak_ptr<char> backward_token_;  // owned by that backward's final callback
  std::vector<bool> ready_;             // per parameter: written into its bucket this backward
  std::vector<std::vector<at::Tensor>> filling_;  // per bucket: its flats, per slice, until launched
  std::vector<std::size_t> pending_;    // per bucket: gradients still missing
  std::size_t next_bucket_ = 0;
  std::deque<InFlight> in_flight_;
  std::vector<bool> local_;             // .grad holds a no_sync accumulation
};

}  // namespace cohort::zero
