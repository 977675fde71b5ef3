#pragma once
// Which gradients travel together. DistributedDataParallel all-reduces gradients in
// buckets, so that communication starts during backward instead of after it. This
// header is the pure planning logic: no tensors, no process group.
//
// Note [Bucket ready order]
// Autograd produces gradients roughly in reverse order of the forward pass, which for
// most models is reverse registration order. Buckets are therefore filled in that
// order, so that the first bucket fills up (and its all-reduce can start) as early in
// backward as possible. Three invariants make this safe across ranks:
//  1. Every rank computes the *same* plan. plan_buckets() is a deterministic function
//     of the parameters' metadata and an order; ranks have identical parameters
//     (checked at DDP construction), so they agree as long as they use the same
//     order. A rebuilt order (2) must come from one rank (rank 0) and be broadcast.
//  2. After the first iteration the plan is rebuilt once, from the order in which
//     gradients actually arrived on rank 0 (parameters that got no gradient go last,
//     in reverse registration order). Later iterations keep that plan: rebuilding
//     again would re-allocate buckets for no gain, and a model whose order changes
//     each step is what static_graph(false) with find_unused_parameters covers.
//  3. Buckets are launched strictly in plan order on every rank, even when a later
//     bucket happens to fill first on one rank. c10d collectives match by call order,
//     so launching out of order on one rank would pair different buckets across ranks.
// A bucket never mixes dtypes or devices (one flat buffer per bucket). The first
// bucket has its own, smaller cap, so the first all-reduce starts early. A bucket
// closes as soon as it reaches its cap, so it overshoots by at most its last
// parameter; with a cap smaller than every parameter, each travels alone.
#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

namespace cohort::ddp {

// What planning needs to know of one parameter.
struct ParamMeta {
  std::string name;
  std::int64_t numel = 0;
  std::int64_t element_size = 4;  // bytes
  std::string dtype;              // buckets never mix dtypes ...
  std::string device;             // ... or devices
  std::int64_t bytes() const { return numel * element_size; }
};

struct BucketOptions {
  TORCH_ARG(std::int64_t, bucket_cap_bytes) = 25 * 1024 * 1024;
  TORCH_ARG(std::int64_t, first_bucket_cap_bytes) = 1024 * 1024;
};

struct Bucket {
  std::vector<std::size_t> params;  // indexes into the parameter list, in fill order
  std::vector<std::int64_t> offsets;  // element offset of each parameter in the bucket
  std::int64_t numel = 0;
  std::int64_t bytes = 0;
  std::string dtype;
  std::string device;
};

struct BucketPlan {
  std::vector<Bucket> buckets;  // in launch order (Note [Bucket ready order])
  std::vector<std::size_t> bucket_of;     // parameter index -> bucket index
  std::vector<std::size_t> position_of;   // parameter index -> position in its bucket
};

// n-1, n-2, ..., 0: the order gradients are expected in before any was observed.
std::vector<std::size_t> reverse_registration_order(std::size_t n);

// The order to rebuild from, given the parameters whose gradients arrived, in arrival
// order: those first, then any missing ones in reverse registration order. Throws
// std::invalid_argument for an index out of range or repeated.
std::vector<std::size_t> order_from_arrivals(const std::vector<std::size_t>& arrived, std::size_t n);

// Plans buckets over `params`, filled in `order` (a permutation of their indexes).
// Throws std::invalid_argument for a bad order or non-positive caps.
BucketPlan plan_buckets(const std::vector<ParamMeta>& params, const std::vector<std::size_t>& order,
                        const BucketOptions& options = BucketOptions());

}  // namespace cohort::ddp
