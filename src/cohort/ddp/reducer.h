#pragma once
// The heart of DDP: gradient buckets, filled by autograd hooks and reduced while
// backward is still running. DistributedDataParallel drives it; it has no notion of
// modules or forward.
//
// One iteration, as the reducer sees it:
//   prepare_for_forward()          rebuild the buckets once, after the first step
//   prepare_for_backward(outputs)  arm the hooks; mark unused parameters ready
//   ... backward: each gradient accumulator's post-hook copies the gradient into its
//       bucket; a full bucket's reduction starts at once, in plan order
//   finalize (an autograd callback at the end of backward, Note [Where backward
//       ends]): launch the step's status (or write it into the last bucket and
//       launch that: Note [The status rides in the last bucket], step_status.h),
//       wait for every bucket, write the averages back to .grad
//   settle()                       at the next forward: close a step whose
//       backward failed part-way (Note [A step that failed], step_status.h)
// How a step ends (completed, mirrored under join, failed) is in step_end.cpp.
//
// Note [Rebuilding buckets]
// The first plan assumes gradients arrive in reverse registration order. During the
// first synchronised backward, every rank records the order its hooks actually fired;
// at the next forward with grad enabled every rank calls rebuild, rank 0 broadcasts
// its order (a fixed-size int64 tensor, so ranks can never disagree on its shape) and
// everyone re-plans from it (Note [Bucket ready order], invariant 1). Parameters
// unused in that step go last. The rebuild happens once: at a forward, because then
// no bucket is in flight on any rank; and only once, because re-allocating buckets
// each step costs memory traffic for no gain. With gradient_as_bucket_view, .grad
// tensors are re-pointed at the new buckets, keeping values accumulated under no_sync.
//
// Note [Where backward ends]
// The end-of-backward work is an autograd callback, and a callback runs when the
// graph task that queued it ends. A reentrant backward (a segment checkpointed
// without .modules(), Note [Parameters behind a custom function]) is a graph task
// of its own, nested in the user's: a callback queued from a gradient hook that
// fires inside it would run when the segment is done, with the parameters before
// it still to come. So prepare_for_backward puts a pre-hook on the node that made
// each output: the first to run queues the callback, in the task that
// differentiates DDP's outputs, which is the whole of DDP's backward. A gradient
// hook queues it only where no output hook ran first (an output without a
// grad_fn, or a backward that does not pass through the outputs); then it is the
// outermost task that reaches the parameters anyway.
//
// Note [Stream ordering]
// On CUDA, the hooks copy gradients into buckets on autograd's current stream.
// ProcessGroupNCCL makes its own communication stream wait for the current stream
// before each collective, so an all-reduce never reads a bucket before the copies
// into it, and the backward stream never waits for communication: the only wait is
// in the end-of-backward callback (Pending::wait), before the averages are copied
// back to .grad on the current stream. Not yet verified on a GPU (no session so far
// had one); on CPU/Gloo the same order holds trivially.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cohort/compat/autograd.h"
#include "cohort/comm/group.h"
#include "cohort/ddp/bucket_plan.h"
#include "cohort/ddp/comm_hook.h"
#include "cohort/ddp/options.h"
#include "cohort/ddp/step_status.h"
#include "cohort/ddp/timings.h"

namespace cohort::ddp {

class Reducer {
 public:
  // `params` must require grad; `names` name them in errors.
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, comm::Group group,
          DistributedDataParallelOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Call on every rank at the start of every forward, with grad or without: closes
  // a synchronised step whose backward failed part-way, waiting (bounded) for its
  // collectives (Note [A step that failed]). Free when there is none.
  void settle();
  // Collective when a rebuild is due (Note [Rebuilding buckets]); call on every rank
  // before a forward with grad enabled.
  void prepare_for_forward();
  // After a forward with grad enabled. With `sync` false (no_sync), backward only
  // accumulates into .grad. `divisor` is what sums are divided by.
  void prepare_for_backward(const std::vector<at::Tensor>& outputs, bool sync, double divisor);
  // For a rank that has joined (ran out of inputs): the collectives of one
  // synchronised backward, contributing zeros. With gradient_as_bucket_view this
  // rank's .grad (the buckets) ends up holding the others' average; otherwise .grad
  // is left untouched.
  void shadow_backward(double divisor);

  const std::vector<at::Tensor>& parameters() const { return params_; }
  const BucketPlan& plan() const { return plan_; }
  bool rebuilt() const { return rebuilt_; }
  const IterationTimings& last_timings() const { return timings_; }

  // Called by the gradient accumulators' hooks, the outputs' hooks (`step` is the
  // step that installed them) and the end-of-backward callback.
  void on_gradient_ready(std::size_t index);
  void on_outputs_reached(std::uint64_t step);
  void finalize_backward();

 private:
  struct BucketState {
    at::Tensor buffer;
    std::vector<std::size_t> params;
    std::vector<at::Tensor> views;  // one per parameter, in params' order
    std::size_t pending = 0;        // gradients still missing this iteration
    bool launched = false;
    std::shared_ptr<GradBucket> in_flight;  // what the hook was given; lives until wait()
    BucketWork work;
  };
  enum class Phase { kIdle, kNoSync, kSync };

  void build_buckets(const std::vector<std::size_t>& order);
  void rebuild();
  void mark_ready(std::size_t index);
  void launch_ready_buckets();
  void launch_remaining_buckets();
  void launch_status(bool failed, std::uint64_t step);
  bool all_ready() const;
  // Note [Where backward ends]
  void hook_outputs(const std::vector<at::Tensor>& outputs);
  void queue_finalize();
  // After the last bucket: which parameters this rank used (find_unused_parameters,
  // static_graph's first step). Every rank launches it at the same point of the step.
  void launch_unused_mask();
  // Waits for the mask; true where some rank used the parameter.
  std::vector<bool> take_unused_mask();
  void end_step();
  void set_divisor(double divisor);
  void abandon_iteration(bool wait_launched);
  // Launches what this rank's failed backward did not, marks it failed, waits for
  // everything and forgets the step (Note [A step that failed]).
  void close_failed_step();
  // Waits for every launched bucket, the mask and the status; on an error drops
  // the rest and leaves the reducer idle. Returns the ranks whose backward failed.
  std::vector<int> wait_for_step();
  // Parameters without a gradient at the end of backward, under
  // find_unused_parameters or static_graph: unused in this step.
  void mark_missing_unused();
  void reset_timings();
  void note_completions(double now);
  // Draws the finished iteration's buckets on the group's timeline (Note [DDP on the timeline]).
  void trace_iteration() const;
  double elapsed() const;
  std::vector<std::string> names_not_ready() const;

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  comm::Group group_;
  DistributedDataParallelOptions options_;
  std::shared_ptr<CommHook> hook_;
  bool identity_ = false;  // Note [A group of one]
  StepStatus status_;      // Note [A step that failed]
  std::vector<compat::NodePtr> accumulators_;
  std::vector<std::uintptr_t> hook_keys_;

  BucketPlan plan_;
  std::vector<BucketState> buckets_;
  std::vector<at::Tensor> views_;  // parameter index -> its slice of its bucket

  // The iteration in progress; guarded by mutex_ (hooks run on autograd threads).
  std::mutex mutex_;
  Phase phase_ = Phase::kIdle;
  double divisor_ = 1;
  at::Tensor inverse_divisor_;  // 1 / divisor_, a 0-dim tensor for mul_out
  bool callback_queued_ = false;
  // Synchronised steps prepared (and mirrored under join): the outputs' hooks and
  // the step status carry it (Note [Steps that pair] in step_status.h).
  std::uint64_t step_ = 0;
  std::shared_ptr<Reducer*> self_;  // the outputs' hooks hold it weakly: a graph may outlive DDP
  bool mask_due_ = false;   // this step ends with the unused-parameter mask
  bool hooks_fired_ = false;
  std::vector<bool> ready_;
  std::vector<bool> locally_used_;
  std::vector<bool> used_since_sync_;  // got a gradient under no_sync since the last reduction
  std::size_t next_bucket_ = 0;
  at::Tensor unused_mask_;  // find_unused_parameters: how many ranks used each parameter
  comm::Pending unused_mask_work_;

  // Note [Rebuilding buckets]
  bool rebuilt_ = false;
  bool rebuild_due_ = false;
  std::vector<std::size_t> arrivals_;

  // static_graph: the parameters unused in the first iteration.
  bool static_unused_known_ = false;
  std::vector<bool> static_used_;
  std::vector<bool> static_globally_used_;  // by some rank, from the first step's mask

  std::chrono::steady_clock::time_point iteration_start_;
  bool timed_ = false;  // record_timings(), or the group has a timeline
  IterationTimings timings_;
};

}  // namespace cohort::ddp
