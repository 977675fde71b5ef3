#pragma once
// ZeRO stage 2's gradients: each parameter's gradient is reduced to the rank that
// owns the parameter (zero/partition.h) and lives there alone. ShardedOptimizer
// makes one when ShardedOptimizerOptions::shard_gradients is on; users do not build
// it themselves, and the model is then not wrapped in DDP.
//
// Note [ZeRO-2 gradients]
// A pre-hook on each trainable parameter's AccumulateGrad node takes the gradient
// before autograd accumulates it, so autograd never writes .grad during a
// synchronised backward: a gradient exists as a full-size tensor only until its
// bucket is launched. Buckets follow DDP's first plan (ddp/bucket_plan.h: reverse
// registration order, launched strictly in plan order on every rank, Note [Bucket
// ready order]). Within a bucket, each owner's gradients are flattened into one
// tensor, divided by the world size (as DDP divides on the way in), and reduced
// (a sum) to that owner: one c10d reduce per owner and bucket, which is a
// reduce-scatter with uneven shards. Gloo in LibTorch 1.13 has no reduce_scatter,
// and c10d's average over Gloo is a sum in some versions, so it is a sum of divided
// values on every backend. The owner's .grad becomes its share of the result,
// aliasing the received tensor (no copy); the other ranks keep no gradient of it.
// At most two buckets are in flight: launching a third first lands the oldest.
//
// Accumulation follows DDP: a parameter's .grad after a synchronised backward is
// what it held before (an earlier average not yet cleared by zero_grad) plus this
// backward's average. Under no_sync, autograd accumulates into .grad locally as
// usual (full size on every rank), and the next synchronised backward sends that
// local sum together with its own gradient; an earlier average that an owner held
// when no_sync began is set aside and added back, not divided again.
//
// A parameter that receives no gradient in a synchronised backward (unused in this
// forward, on this rank) contributes zeros, so every rank launches every bucket.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

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
  void check_before_step() const;

  // Bytes of gradient this rank holds (.grad of every parameter).
  std::int64_t local_gradient_bytes() const;
  // Buckets of the plan (for tests and docs).
  std::size_t buckets() const { return plan_.buckets.size(); }

  // Called by the pre-hooks and at the end of backward.
  at::Tensor take(std::size_t k, const at::Tensor& incoming);
  void finalize_backward();

 private:
  struct InFlight {
    std::size_t bucket = 0;
    int owner = 0;
    std::vector<std::size_t> members;  // indexes into trainable_
    at::Tensor flat;                   // the divided gradients; the sum, on the owner, once landed
    comm::Pending pending;
  };
  at::Tensor& param(std::size_t k) { return params_[trainable_[k]]; }
  int owner(std::size_t k) const { return owners_[trainable_[k]]; }
  void arm();
  void launch_ready_buckets();
  void launch(std::size_t bucket);
  void land(InFlight& f);
  void reset_iteration();

  std::vector<at::Tensor> params_;
  std::vector<int> owners_;
  comm::Group group_;
  std::vector<std::size_t> trainable_;  // indexes of the parameters that require grad
  ddp::BucketPlan plan_;                 // over trainable_
  at::Tensor inverse_world_;            // 1 / world size, a 0-dim double tensor (as DDP's)
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<const void*> hook_keys_;

  mutable std::mutex mutex_;
  bool sync_ = true;
  bool armed_ = false;  // a synchronised backward is under way
  std::vector<at::Tensor> incoming_;    // each parameter's contribution until its bucket goes
  std::vector<std::size_t> pending_;    // per bucket: gradients still missing
  std::size_t next_bucket_ = 0;
  std::deque<InFlight> in_flight_;
  std::vector<bool> local_;             // .grad holds a no_sync accumulation
  std::vector<at::Tensor> set_aside_;   // an owner's earlier average, while no_sync accumulates
};

}  // namespace cohort::zero
