#pragma once
// One flat parameter of a fully sharded unit (zero/fully_shard.h): the unit's
// parameters of one dtype that all require grad, or all do not, laid end to end.
// Users meet it only through FullyShardedModel::parameters(), which lists the
// shards the optimizer steps.
//
// Note [Flat parameters]
// The unit's parameters p_0..p_k (each once, in module order) take offsets o_i in a
// flat of T elements, padded with zeros to P = N * ceil(T / N) for N ranks. Rank r
// keeps chunk r, C = P / N elements from r * C: that is shard(), a leaf tensor the
// optimizer steps, and the only copy of those values that persists.
//
// Gathering (all-gather of the N shards) fills a full buffer of P elements, and
// every original parameter is bound to its place in it (its TensorImpl's storage,
// offset, sizes and dtype are set directly, so no version counter moves and
// autograd's saved tensors stay valid). The model's own code then computes with
// the parameters as if nothing were sharded.
//
// Note [Freeing in place]
// Autograd keeps views of a parameter from the forward to the backward (linear
// saves weight.t()). A view holds the parameter's storage, not the parameter, so
// freeing by giving the parameter a new storage would leave the old one alive
// through the view, and the memory would not be freed. Instead the full buffer has
// one StorageImpl for the flat's life: resharding releases its allocation (its data
// pointer becomes null and its size 0) and gathering allocates a new one in the
// same StorageImpl. Views taken in the forward then see the gathered values again
// in the backward. Between the two a parameter is an empty tensor (sizes [0]) over
// the released storage: code that reads it outside its unit meets a shape error,
// not freed memory. Gathering gives it back its sizes before autograd unpacks it.
//
// A gathered buffer is stale once the shard changes (an optimizer step, a loaded
// checkpoint). LibTorch 1.13's optimizers update p.data(), which has a version
// counter of its own, so the shard's counter does not see a step: the schedule
// invalidates every flat when FullyShardedOptimizer steps and whenever the outermost
// unit starts a forward (Note [Fresh gathers] in zero/shard_schedule.h). Each gather
// also records the shard's version counter, for writes that do move it (copy_ into
// the shard).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/compat/autograd.h"
#include "cohort/comm/group.h"

namespace torch::autograd {
struct Node;
}

namespace cohort::zero {

class FlatParameter {
 public:
  // Collective. `params`: distinct tensors of one dtype and device, all requiring
  // grad or none. Copies this rank's chunk of rank 0's values into shard() and frees
  // the rest.
  // param_dtype: the dtype the parameters are gathered in for compute (floating
  // point only; ignored otherwise).
  FlatParameter(std::vector<at::Tensor> params, std::vector<std::string> names, comm::Group group,
                std::optional<at::ScalarType> param_dtype);
  FlatParameter(const FlatParameter&) = delete;
  FlatParameter& operator=(const FlatParameter&) = delete;

  const at::Tensor& shard() const { return shard_; }
  bool trainable() const { return shard_.requires_grad(); }
  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  std::int64_t offset(std::size_t i) const { return offsets_[i]; }
  // params()[i]'s own shape and size (the parameter itself is empty while freed).
  const std::vector<std::int64_t>& shape(std::size_t i) const { return shapes_[i]; }
  std::int64_t numel(std::size_t i) const;
  std::int64_t total_numel() const { return total_; }
  std::int64_t padded_numel() const { return chunk_ * world_; }
  std::int64_t chunk_numel() const { return chunk_; }
  at::ScalarType compute_dtype() const { return compute_dtype_; }
  // params()[i]'s AccumulateGrad node (trainable flats only).
  const compat::NodePtr& accumulator(std::size_t i) const { return accumulators_.at(i); }

  // For compute: starts the all-gather (no-op when gathered and fresh, or in
  // flight); finish_gather() waits for it and binds the parameters.
  void start_gather();
  void finish_gather();
  bool gathered() const;
  // Marks what is gathered, or in flight, as stale: the next use gathers again.
  void invalidate();
  // Frees the full buffer (Note [Freeing in place]); waits for a gather in flight.
  void reshard();
  // Whether `t` shares the full buffer's storage (a view of a gathered parameter).
  bool holds(const at::Tensor& t) const;
  // Bytes of the full buffer while it is allocated, else 0.
  std::int64_t gathered_bytes() const;

  // For state dicts (FullyShardedModel::FullParameters): gathers in the shard's own
  // dtype into a buffer of its own and binds the parameters there. release_state()
  // copies this rank's chunk back into the shard when `write_back` (from each
  // parameter, even one given new storage meanwhile, as torch::load's set_() does),
  // and leaves the parameters empty again.
  void gather_state();
  void release_state(bool write_back);
  // Inside gather_state() .. release_state().
  bool holds_state() const { return state_full_.defined(); }
  // Why release_state(true) would fail (a parameter given another size meanwhile);
  // empty when it would not.
  std::string write_back_error() const;

 private:
  void bind(const at::Tensor& buffer);
  void unbind();
  void allocate(const at::Tensor& buffer) const;
  void release(const at::Tensor& buffer) const;

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::vector<std::int64_t>> shapes_;
  std::vector<std::int64_t> offsets_;
  comm::Group group_;
  int world_ = 1;
  int rank_ = 0;
  std::int64_t total_ = 0;
  std::int64_t chunk_ = 0;
  at::ScalarType compute_dtype_;
  at::Tensor shard_;
  at::Tensor full_;         // P elements of compute_dtype_; one StorageImpl for life
  at::Tensor send_;         // the shard cast to compute_dtype_, while a gather is in flight
  bool allocated_ = false;
  bool in_flight_ = false;
  comm::Pending pending_;
  std::int64_t gathered_version_ = -1;  // the shard's version when full_ was filled
  std::int64_t epoch_ = 0;               // bumped by invalidate()
  std::int64_t gathered_epoch_ = -1;     // epoch_ when full_ was filled
  at::Tensor state_full_;   // gather_state()'s buffer, in the shard's dtype
  std::vector<compat::NodePtr> accumulators_;
};

}  // namespace cohort::zero
