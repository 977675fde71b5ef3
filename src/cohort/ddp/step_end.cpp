// How a synchronised step ends: completed (finalize_backward, at the end of
// backward), mirrored by a rank that has joined (shadow_backward), failed part-way
// (settle and close_failed_step, at the next forward; Note [A step that failed] in
// step_status.h), or abandoned (a forward that had no backward).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "cohort/ddp/reducer.h"
#include "cohort/errors.h"
#include "cohort/system/stream_capture.h"

namespace cohort::ddp {

// Note [DDP inside a CUDA graph]
// A CUDA graph captures the kernels a step launches and replays them with no host
// code at all: no hook, no bookkeeping. So what the reducer does on the host must be
// the same in every step, and it must not make the host wait for the device. While
// the parameters' stream is being captured (system::stream_capturing), the reducer
//  - makes the stream wait for each bucket's all-reduce where it would make the
//    host wait, bounded, for it (comm::Pending::wait sees the capture too);
//  - launches no step status of its own and reads none: a replay cannot fail
//    part-way on one rank, and every rank replays the same step (Note [Steps that
//    pair] is about host code that differs between ranks). A status riding in the
//    last bucket is still written (a kernel) and its sum ignored.
// What would differ between steps is refused before the capture starts, with the
// fix (cuda_graphs/captured_step.h, why_not_capturable): the unused-parameter search
// (find_unused_parameters, static_graph), join, comm hooks (they may keep host
// state, as PowerSGD does), bucket timings and timelines (event queries), buffer
// broadcasts (a bounded host wait), a backend other than NCCL, and buckets not yet
// rebuilt (Note [Rebuilding buckets]: the rebuild reads the host; run two steps
// first). Not yet run on a GPU.

namespace {

std::string join_names(const std::vector<std::string>& names, std::size_t limit = 10) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < limit; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > limit) out += fmt::format(", ... ({} in all)", names.size());
  return out;
}

}  // namespace

void Reducer::settle() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ != Phase::kSync) return;
  // Note [A step that failed]. Without a gradient arrived, this was a forward
  // with no backward: only what the forward launched is in flight, and every rank
  // launched it, so it is waited for.
  if (hooks_fired_) close_failed_step();
  else abandon_iteration(/*wait_launched=*/true);
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  callback_queued_ = false;
  if (phase_ != Phase::kSync) return;
  if (timed_) timings_.backward_end_s = elapsed();
  if (!all_ready()) {
    if (options_.find_unused_parameters() || options_.static_graph()) {
      mark_missing_unused();
    } else {
      auto missing = names_not_ready();
      close_failed_step();  // every rank's collectives stay paired, whatever the others' backward did
      throw ConfigError(fmt::format(
          "cohort DDP (rank {}): backward finished, but {} parameter(s) received no gradient in this step: {}. "
          "DDP reduces gradients in buckets and cannot tell a gradient that never comes from a late one. Fix: "
          "make every parameter contribute to the loss, or construct DDP with "
          "DistributedDataParallelOptions().find_unused_parameters(true) (or .static_graph(true) when the "
          "same parameters are unused in every step). This step's gradients were not synchronised",
          group_.rank(), missing.size(), join_names(missing)));
    }
  }
  if (mask_due_) launch_unused_mask();
  launch_status(/*failed=*/false, step_);
  auto failed = wait_for_step();
  if (!failed.empty()) {
    std::vector<std::string> ranks;
    for (int r : failed) ranks.push_back(std::to_string(r));
    abandon_iteration(/*wait_launched=*/false);
    throw CommError(fmt::format(
        "cohort DDP (rank {}): the backward of {} {} failed in this step (see its output), so the averaged "
        "gradients are incomplete. They were discarded: this rank's .grad holds unspecified values. Fix: skip "
        "this step here too (catch this error, do not call optimizer.step(), zero the gradients); the next "
        "step synchronises normally (Note [A step that failed])",
        group_.rank(), failed.size() == 1 ? "rank" : "ranks", join_names(ranks)));
  }
  std::vector<bool> globally_used(params_.size(), true);
  if (unused_mask_.defined()) {
    globally_used = take_unused_mask();
    if (options_.static_graph()) static_globally_used_ = globally_used;
  } else if (options_.static_graph()) {
    // The first step's answer holds for every step; if that step never completed,
    // static_graph's promise makes the local answer the global one.
    globally_used = static_globally_used_.empty() ? static_used_ : static_globally_used_;
  }

  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size() && !identity_; ++i) {
    if (!globally_used[i]) continue;  // nobody used it: leave .grad as it was, like a local step
    auto& grad = params_[i].mutable_grad();
    if (options_.gradient_as_bucket_view()) {
      if (!grad.defined() || !grad.is_alias_of(views_[i])) grad = views_[i];
    } else if (grad.defined()) {
      grad.copy_(views_[i]);
    } else {
      grad = views_[i].clone();
    }
  }
  end_step();
  if (timed_) {
    timings_.finalize_end_s = elapsed();
    trace_iteration();
  }
}

void Reducer::shadow_backward(double divisor) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  callback_queued_ = false;
  set_divisor(divisor);
  reset_timings();
  const bool static_first = options_.static_graph() && !static_unused_known_;
  next_bucket_ = 0;
  for (auto& b : buckets_) {
    b.buffer.zero_();
    b.pending = 0;
  }
  launch_ready_buckets();
  if (options_.find_unused_parameters() || static_first) {  // after the buckets, as the others launch it
    std::fill(locally_used_.begin(), locally_used_.end(), false);
    launch_unused_mask();
  }
  launch_status(/*failed=*/false, ++step_);  // mirrors the active ranks' step (Note [Steps that pair])
  // A rank whose backward failed in this step is the active ranks' concern; but they
  // discard the step, and so does this rank: in particular it makes no rebuild due
  // that they would not (Note [Rebuilding buckets]), or its rebuild's broadcast would
  // meet their next buckets.
  if (!wait_for_step().empty()) {
    abandon_iteration(/*wait_launched=*/false);
    return;
  }
  if (unused_mask_.defined()) {
    auto used = take_unused_mask();
    if (static_first) {  // the others' first step: what they use is the static set
      static_used_ = static_globally_used_ = used;
      static_unused_known_ = true;
    }
  }
  end_step();
}

// Forgets the step in progress. With `wait_launched` (a forward that had no
// backward: every rank issued the same reductions, so they complete), reductions
// already started are waited for, so none still writes into a bucket the next step
// uses. Otherwise they are dropped: they completed already (the step was closed),
// or a wait failed and the group is broken.
void Reducer::abandon_iteration(bool wait_launched) {
  if (wait_launched) {
    wait_for_step();
  }
  callback_queued_ = false;
  for (auto& b : buckets_) {
    b.work = BucketWork();
    b.in_flight.reset();
    b.launched = false;
  }
  unused_mask_ = at::Tensor();
  unused_mask_work_ = comm::Pending();
  mask_due_ = false;
  if (status_.launched()) status_.drop();
  next_bucket_ = 0;
  phase_ = Phase::kIdle;
}

// Note [A step that failed]: the same collectives as a completed step, in the same
// order, so that every rank's sequence stays paired with the others'.
void Reducer::close_failed_step() {
  launch_remaining_buckets();
  if (mask_due_ && !unused_mask_.defined()) launch_unused_mask();
  if (!status_.launched()) launch_status(/*failed=*/true, step_);
  wait_for_step();
  abandon_iteration(/*wait_launched=*/false);
  // With bucket views, .grad is bucket memory, and the reductions just waited for
  // wrote the failed step's sums into it, possibly after the training loop zeroed
  // the gradients: zero it, as the loop meant to.
  if (options_.gradient_as_bucket_view()) {
    at::NoGradGuard no_grad;
    for (auto& b : buckets_) b.buffer.zero_();
  }
}

// After the last bucket and the mask: riding, the status's slot is written and the
// last bucket launched with it (Note [The status rides in the last bucket]).
void Reducer::launch_status(bool failed, std::uint64_t step) {
  // Note [DDP inside a CUDA graph]: a status of its own is not launched in a capture.
  if (status_.rides() || !system::stream_capturing(params_.front().device())) status_.launch(failed, step);
  launch_ready_buckets();
}

void Reducer::launch_remaining_buckets() {
  for (std::size_t b = next_bucket_; b < buckets_.size(); ++b) buckets_[b].pending = 0;
  launch_ready_buckets();
}

std::vector<int> Reducer::wait_for_step() {
  if (system::stream_capturing(params_.front().device())) {  // Note [DDP inside a CUDA graph]
    for (auto& b : buckets_) {
      if (!b.launched) continue;
      b.work.wait();  // the stream waits (comm::Pending::wait in a capture), not the host
      b.in_flight.reset();
    }
    if (status_.launched()) status_.drop();
    return {};
  }
  try {
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      if (!buckets_[b].launched) continue;
      if (timed_) note_completions(elapsed());
      buckets_[b].work.wait();
      buckets_[b].in_flight.reset();
      if (timed_ && timings_.buckets[b].done_s < 0) timings_.buckets[b].done_s = elapsed();
    }
    unused_mask_work_.wait();
    return status_.wait();
  } catch (...) {
    // One bounded wait failed: the group is broken or out of step, and waiting for
    // the rest would only multiply the timeout.
    abandon_iteration(/*wait_launched=*/false);
    throw;
  }
}

void Reducer::mark_missing_unused() {
  const bool static_first = options_.static_graph() && static_globally_used_.empty();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    locally_used_[i] = false;
    if (static_first) static_used_[i] = false;  // later steps mark it ready at the forward
    mark_ready(i);
  }
}

std::vector<bool> Reducer::take_unused_mask() {
  unused_mask_work_.wait();
  auto counts = unused_mask_.cpu().contiguous();
  unused_mask_ = at::Tensor();
  const int* used_by = counts.data_ptr<int>();
  return std::vector<bool>(used_by, used_by + params_.size());  // nonzero: some rank used it
}

}  // namespace cohort::ddp
