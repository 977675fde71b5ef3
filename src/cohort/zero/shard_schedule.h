#pragma once
// When ZeRO-3's units gather, free and reduce (zero/fully_shard.h). One schedule
// serves every unit of one fully_shard() call; the units call it around their
// forward, and autograd calls it in backward. Users do not build one themselves.
//
// Note [ZeRO-3 schedule]
// Units are numbered in module pre-order; unit 0 is the outermost.
//  1. Forward. Before a unit's forward its flat parameters are gathered (waiting
//     for a prefetch when there is one), and the unit that ran next in the previous
//     forward starts gathering. After it, a hook goes on each output that requires
//     grad, and the unit is freed (reshard_after_forward, not the outermost unit).
//     A unit whose outputs need no gradient is freed at once: no backward follows.
//     One that returns anything but a tensor stays gathered until the end of the
//     backward, since no hook can tell when its backward starts.
//  2. Backward. The first output hook to fire gathers the unit again and prefetches
//     the unit whose hook fired next in the previous backward. A pre-hook on each
//     trainable parameter's AccumulateGrad node takes its gradient (autograd never
//     writes the original parameters' .grad) into the flat's gradient buffer. When
//     all of a unit's trainable parameters have theirs, autograd has run every node
//     that reads them, and the unit is freed.
//  3. Reduction. A flat whose gradients are complete is divided by the world size
//     (Note [Divide on the way in] in ddp/reducer.cpp) and reduce-scattered; this
//     rank's chunk is added to its shard's .grad, in the shard's dtype. Flats are
//     reduced strictly in plan order, the units in reverse pre-order, on every rank
//     (Note [Bucket ready order]); at most two are in flight. A parameter without a
//     gradient in this backward contributes zeros, so every rank reduces every flat.
//  4. The end of the backward (an autograd final callback) reduces what is left,
//     agrees which parameters no rank used (Note [Unused parameters under ZeRO-3]),
//     lands every reduction and frees every unit.
// Every rank must run the same units in the same order: the gathers and the
// reductions are collectives, and ranks that differ are caught by the group's
// timeout, which names the operation.
//
// Under no_sync(), each flat's gradients are summed locally at full size instead,
// and the next synchronised backward adds that sum before it divides and reduces.
//
// Note [Unused parameters under ZeRO-3]
// One process skips a parameter whose .grad is undefined: weight decay and Adam's
// moments leave it alone. Here the optimizer steps whole flats, so the schedule
// keeps, per original parameter, whether one process's .grad would be defined
// (has_grad): it becomes so once any rank gives the parameter a gradient (this
// backward's or a no_sync sum), and is cleared when the shard's .grad is (None).
// Which parameters some rank used is agreed by one all-reduce of a vote per
// trainable parameter at the end of each synchronised backward (as DDP's
// find_unused_parameters does). A flat none of whose parameters has a gradient keeps
// an undefined .grad, so the optimizer skips it whole; FullyShardedOptimizer also
// puts back the values and state of the elements of a flat that belong to a
// parameter without one (unused_ranges()). A plain optimizer over the shards gets
// the first only.
//
// Note [Fresh gathers]
// A unit must never compute with values from before an optimizer step. After a
// backward nothing is gathered (4 above), but a forward without backward (an
// evaluation) may leave a prefetch in flight, and a unit that returns no tensor
// stays gathered. So: FullyShardedOptimizer::step() invalidates every flat; the
// outermost unit's forward, outside a backward, starts by freeing every unit (any
// plain optimizer steps between forwards); and the outermost unit's forward without
// grad ends by freeing every unit.
//
// Note [no_sync and zero_grad]
// That local sum stands for DDP's accumulated .grad, which zero_grad() clears. The
// optimizer's zero_grad() reaches only the shards' .grad (and is not virtual in
// LibTorch 1.13), so the sum is tied to the shard's .grad instead: when it starts,
// the shard gets a .grad (zeros) if it has none, and its identity and version
// counter are recorded. zero_grad() zeroes it (a new version) or resets it (another
// tensor, or none); either way the local sum is stale and is dropped. Nothing else
// touches a shard's .grad between backwards.
#include <ATen/core/Tensor.h>

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cohort/compat/autograd.h"
#include "cohort/comm/group.h"
#include "cohort/zero/flat_parameter.h"
#include "cohort/zero/fully_shard_options.h"

namespace torch::autograd {
struct Node;
}

namespace cohort::zero {

class ShardSchedule : public std::enable_shared_from_this<ShardSchedule> {
 public:
  struct Unit {
    std::string name;              // its path in the model ("" for the outermost)
    std::vector<std::size_t> flats;  // into flats()
  };

  ShardSchedule(comm::Group group, FullyShardOptions options);
  ~ShardSchedule();
  ShardSchedule(const ShardSchedule&) = delete;
  ShardSchedule& operator=(const ShardSchedule&) = delete;

  // Set-up, by fully_shard(): units in pre-order, then start() once.
  void add_unit(std::string name, std::vector<std::unique_ptr<FlatParameter>> flats);
  void start();

  // By the units, around their forward. post_forward() gets the unit's tensor
  // outputs; `opaque` when it returned something else.
  void pre_forward(std::size_t unit);
  // Whether `t` is a view of one of the unit's gathered parameters: such an output
  // must not outlive the unit's gathered buffer (the unit clones it).
  bool aliases(std::size_t unit, const at::Tensor& t) const;
  void post_forward(std::size_t unit, const std::vector<at::Tensor>& outputs, bool opaque);

  void set_sync(bool sync);
  bool sync() const;

  const std::vector<Unit>& units() const { return units_; }
  const std::vector<std::unique_ptr<FlatParameter>>& flats() const { return flats_; }
  const comm::Group& group() const { return group_; }
  const FullyShardOptions& options() const { return options_; }
  // The parameters as (flat, index in it), each once, in the model's parameters()
  // order, frozen ones too: how a whole optimizer state lists them.
  using Place = std::pair<std::size_t, std::size_t>;
  void set_whole_order(std::vector<Place> order) { whole_order_ = std::move(order); }
  const std::vector<Place>& whole_order() const { return whole_order_; }
  // After the shards changed (FullyShardedOptimizer::step): the next use gathers again.
  void invalidate_all();
  // Frees every unit; refused during a backward.
  void reshard_all(const char* why);
  // Note [Unused parameters under ZeRO-3]: the parts of flat f's shard (offsets in
  // the shard, lengths) that belong to parameters without a gradient, while the
  // shard has a .grad; empty otherwise.
  std::vector<std::pair<std::int64_t, std::int64_t>> unused_ranges(std::size_t flat) const;
  // Parameters whose requires_grad changed after fully_shard() (unfrozen): refused,
  // since their flat holds no gradient for them. Freezing one is allowed (it gets no
  // gradient, Note [Unused parameters under ZeRO-3]). `where` names the caller.
  void check_trainable(const char* where) const;
  // A failure that could not be thrown where it happened (a destructor): the next
  // forward, step or full_parameters() throws it, once.
  void record_failure(std::string what);
  void raise_recorded_failure();

  // Called by autograd.
  void pre_backward(std::size_t unit);
  at::Tensor take(std::size_t flat, std::size_t param, const at::Tensor& grad);
  void finalize_backward();

 private:
  struct Gradients {
    at::Tensor flat;    // this backward's gradients, padded, in the reduce dtype
    at::Tensor local;   // no_sync's full-size sum
    // The shard's .grad when `local` began (Note [no_sync and zero_grad]).
    const void* grad_impl = nullptr;
    std::int64_t grad_version = -1;
    std::vector<bool> arrived;
    std::size_t missing = 0;
    // Note [Unused parameters under ZeRO-3], per parameter of the flat.
    std::vector<bool> used;        // a gradient in this synchronised backward
    std::vector<bool> used_local;  // a part of `local`
    std::vector<bool> has_grad;    // one process's .grad would be defined
    bool grad_was_undefined = false;  // the shard's .grad before this backward landed
  };
  struct InFlight {
    std::size_t flat = 0;
    at::Tensor input;
    at::Tensor output;
    comm::Pending pending;
  };
  void gather(std::size_t unit);
  void prefetch_after(std::size_t unit, const std::vector<std::size_t>& order);
  void reshard(std::size_t unit, bool frozen_too);
  void arm();
  void drop_abandoned_backward();  // Note [An abandoned backward] in zero/gradient_sharder.cpp
  void launch_ready();
  void launch(std::size_t flat);
  void land(InFlight& f);
  void drop_cleared_local(std::size_t flat);
  void unit_gradients_complete(std::size_t unit);
  void reset_iteration();
  void agree_on_unused();
  at::ScalarType reduce_dtype(const FlatParameter& flat) const;

  comm::Group group_;
  FullyShardOptions options_;
  std::vector<Unit> units_;
  std::vector<std::unique_ptr<FlatParameter>> flats_;
  std::vector<std::size_t> unit_of_;    // per flat
  std::vector<std::size_t> plan_;       // trainable flats in reduction order
  std::vector<Place> whole_order_;
  std::vector<Gradients> grads_;        // per flat
  at::Tensor inverse_world_;
  std::vector<compat::NodePtr> accumulators_;
  std::vector<const void*> hook_keys_;

  mutable std::recursive_mutex mutex_;
  bool sync_ = true;
  bool armed_ = false;
  std::weak_ptr<char> backward_token_;
  std::size_t next_launch_ = 0;
  std::vector<bool> complete_;          // per flat, this backward
  std::deque<InFlight> in_flight_;
  std::vector<std::size_t> forward_order_, backward_order_;            // this iteration
  std::vector<std::size_t> last_forward_order_, last_backward_order_;  // the previous one
  std::string failure_;  // record_failure()
};

}  // namespace cohort::zero
