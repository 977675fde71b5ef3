#include "cohort/ddp/reducer.h"

#include <ATen/ATen.h>
#include <c10/util/strides.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "cohort/ddp/autograd_graph.h"
#include "cohort/errors.h"

namespace cohort::ddp {

namespace {

// Runs after a parameter's AccumulateGrad node: .grad now holds this step's gradient.
class GradientReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradientReadyHook(Reducer* reducer, std::size_t index) : reducer_(reducer), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    reducer_->on_gradient_ready(index_);
    return outputs;
  }

 private:
  Reducer* reducer_;
  std::size_t index_;
};

// Runs before the node that made one of DDP's outputs, in the graph task that
// differentiates them (Note [Where backward ends]).
class OutputsReachedHook : public torch::autograd::FunctionPreHook {
 public:
  OutputsReachedHook(std::weak_ptr<Reducer*> reducer, std::uint64_t step) : reducer_(std::move(reducer)), step_(step) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (auto reducer = reducer_.lock()) (*reducer)->on_outputs_reached(step_);
    return grads;
  }

 private:
  std::weak_ptr<Reducer*> reducer_;
  std::uint64_t step_;
};

// Note [Gradients that alias a bucket]
// A parameter's slice of its bucket shares the bucket's storage but is *not* an
// autograd view of it (narrow().view() would be): LibTorch 1.13's
// Optimizer::zero_grad() calls grad.detach_(), which autograd refuses on views. A
// tensor set_() onto the same storage aliases the memory (is_alias_of holds) while
// being an ordinary tensor, so gradient_as_bucket_view works with stock optimizers.
//
// Note [Bucket views keep the parameter's layout]: a parameter stored densely in
// another order (channels-last convolution weights) gets a slice with its own
// strides, as PyTorch's DDP does, so that its gradient (which autograd lays out like
// the parameter) is copied in without a transpose and can alias its slice under
// gradient_as_bucket_view. Any other layout gets contiguous strides.
at::Tensor bucket_slice(const at::Tensor& buffer, std::int64_t offset, const at::Tensor& param) {
  auto slice = at::empty({0}, buffer.options());
  if (param.is_non_overlapping_and_dense())
    slice.set_(buffer.storage(), buffer.storage_offset() + offset, param.sizes(), param.strides());
  else
    slice.set_(buffer.storage(), buffer.storage_offset() + offset, param.sizes(), c10::contiguous_strides(param.sizes()));
  return slice;
}

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, comm::Group group,
                 DistributedDataParallelOptions options)
    : params_(std::move(params)),
      names_(std::move(names)),
      group_(std::move(group)),
      options_(std::move(options)),
      hook_(options_.comm_hook() ? options_.comm_hook() : all_reduce_hook()),
      status_(group_, params_.empty() ? c10::Device(c10::kCPU) : params_.front().device()) {
  TORCH_INTERNAL_ASSERT(params_.size() == names_.size());
  self_ = std::make_shared<Reducer*>(this);
  timed_ = options_.record_timings() || group_.recorder() != nullptr;
  if (params_.empty())
    throw ConfigError("cohort DDP: the module has no parameter that requires grad, so there is nothing to "
                      "synchronise; wrap a module with trainable parameters");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].is_sparse())
      throw ConfigError(fmt::format("cohort DDP: parameter '{}' is sparse; only dense parameters are supported",
                                    names_[i]));
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    TORCH_INTERNAL_ASSERT(acc, "a leaf parameter that requires grad has a gradient accumulator");
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<GradientReadyHook>(this, i)));
    accumulators_.push_back(std::move(acc));
  }
  ready_.assign(params_.size(), false);
  locally_used_.assign(params_.size(), true);
  used_since_sync_.assign(params_.size(), false);
  // Note [A group of one]: with one rank and the default hook, the average of the
  // gradients is the gradients, so buckets are never filled or copied back; hooks,
  // bucket order and the unused-parameter errors still run, so behaviour is the
  // same as at any world size, and no bucket memory is allocated. A custom hook
  // (which may compress) or bucket views (which must alias the bucket) keep the
  // full path.
  identity_ = group_.size() == 1 && !options_.comm_hook() && !options_.gradient_as_bucket_view();
  build_buckets(reverse_registration_order(params_.size()));
}

Reducer::~Reducer() {
  for (std::size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void Reducer::build_buckets(const std::vector<std::size_t>& order) {
  std::vector<ParamMeta> metas;
  metas.reserve(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    metas.push_back({names_[i], p.numel(), static_cast<std::int64_t>(p.element_size()),
                     std::string(c10::toString(p.scalar_type())), p.device().str()});
  }
  plan_ = plan_buckets(metas, order,
                       BucketOptions()
                           .bucket_cap_bytes(options_.bucket_cap_bytes())
                           .first_bucket_cap_bytes(options_.first_bucket_cap_bytes()));

  at::NoGradGuard no_grad;
  // Free the old buckets before allocating the new ones, so a rebuild does not hold
  // two sets at once. Gradients that alias the old buckets keep their memory alive
  // until they are copied below.
  buckets_.clear();
  views_.assign(params_.size(), at::Tensor());
  std::vector<BucketState> buckets(plan_.buckets.size());
  // Note [The status rides in the last bucket] (step_status.h)
  const auto last_type = params_[plan_.buckets.back().params.front()].scalar_type();
  const bool ride = !identity_ && group_.size() > 1 && !options_.comm_hook() &&
                    (last_type == at::kFloat || last_type == at::kDouble);
  for (std::size_t b = 0; b < plan_.buckets.size(); ++b) {
    const auto& planned = plan_.buckets[b];
    auto& bucket = buckets[b];
    const auto& first = params_[planned.params.front()];
    bucket.params = planned.params;
    if (identity_) {  // Note [A group of one]: no memory for buckets that are never filled
      bucket.buffer = at::empty({0}, first.options().requires_grad(false));
      continue;
    }
    const bool slots = ride && b + 1 == plan_.buckets.size();
    bucket.buffer = at::zeros({planned.numel + (slots ? group_.size() : 0)}, first.options().requires_grad(false));
    for (std::size_t k = 0; k < planned.params.size(); ++k) {
      const auto i = planned.params[k];
      auto view = bucket_slice(bucket.buffer, planned.offsets[k], params_[i]);
      auto& grad = params_[i].mutable_grad();
      if (grad.defined()) {
        view.copy_(grad);  // keeps what no_sync accumulated across a rebuild
        if (options_.gradient_as_bucket_view()) grad = view;
      }
      bucket.views.push_back(view);
      views_[i] = view;
    }
  }
  buckets_ = std::move(buckets);
  status_.ride_on(ride ? buckets_.back().buffer.narrow(0, plan_.buckets.back().numel, group_.size()) : at::Tensor());
}

void Reducer::prepare_for_forward() {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  if (rebuild_due_ && !rebuilt_) rebuild();
}

void Reducer::rebuild() {
  const auto n = params_.size();
  auto order_t = at::empty({static_cast<std::int64_t>(n)}, at::TensorOptions().dtype(at::kLong));
  if (group_.rank() == 0) {
    auto order = order_from_arrivals(arrivals_, n);
    for (std::size_t k = 0; k < n; ++k) order_t[k] = static_cast<std::int64_t>(order[k]);
  }
  auto on_device = order_t.to(params_.front().device());
  group_.broadcast(on_device, 0);
  order_t = on_device.cpu();
  std::vector<std::size_t> order(n);
  for (std::size_t k = 0; k < n; ++k) order[k] = static_cast<std::size_t>(order_t[k].item<std::int64_t>());
  build_buckets(order);
  rebuilt_ = true;
  rebuild_due_ = false;
  arrivals_ = {};
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs, bool sync, double divisor) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  callback_queued_ = false;  // no backward runs now; a failed one never ran its callback
  set_divisor(divisor);
  phase_ = sync ? Phase::kSync : Phase::kNoSync;
  if (!sync) return;

  reset_timings();
  std::fill(ready_.begin(), ready_.end(), false);
  hooks_fired_ = false;
  next_bucket_ = 0;
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
  }
  if (!rebuilt_) arrivals_.clear();
  ++step_;
  hook_outputs(outputs);

  const bool static_first = options_.static_graph() && !static_unused_known_;
  if (static_first || (options_.find_unused_parameters() && !options_.static_graph())) {
    auto walk = reachable_accumulators(outputs, accumulators_);
    // Note [Parameters behind a custom function]: what the walk cannot reach may
    // still come; what got no gradient by the end of backward is unused then.
    if (walk.through_custom_function) std::fill(locally_used_.begin(), locally_used_.end(), true);
    else locally_used_ = std::move(walk.used);
  } else if (options_.static_graph()) {
    locally_used_ = static_used_;
  } else {
    std::fill(locally_used_.begin(), locally_used_.end(), true);
  }
  if (static_first) {
    static_used_ = locally_used_;
    static_unused_known_ = true;
  }
  mask_due_ = options_.find_unused_parameters() || static_first;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!locally_used_[i]) mark_ready(i);
}

void Reducer::hook_outputs(const std::vector<at::Tensor>& outputs) {
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad() || !out.grad_fn()) continue;
    auto& hooks = out.grad_fn()->pre_hooks();
    // A node that outlives its step (an output kept across forwards) keeps one hook.
    hooks.erase(std::remove_if(hooks.begin(), hooks.end(),
                               [](const auto& h) { return dynamic_cast<OutputsReachedHook*>(h.get()) != nullptr; }),
                hooks.end());
    hooks.push_back(std::make_unique<OutputsReachedHook>(self_, step_));
  }
}

void Reducer::on_outputs_reached(std::uint64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ == Phase::kSync && step == step_) queue_finalize();
}

void Reducer::queue_finalize() {
  if (callback_queued_) return;
  callback_queued_ = true;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize_backward(); });
}

void Reducer::reset_timings() {
  iteration_start_ = std::chrono::steady_clock::now();
  timings_ = IterationTimings();
  if (timed_)
    for (const auto& b : plan_.buckets) timings_.buckets.push_back(BucketTiming{b.bytes});
}

void Reducer::set_divisor(double divisor) {
  if (divisor == divisor_ && inverse_divisor_.defined()) return;
  divisor_ = divisor;
  inverse_divisor_ = at::scalar_tensor(1.0 / divisor, at::TensorOptions().dtype(at::kDouble));
}

void Reducer::launch_unused_mask() {
  // A parameter that got a gradient under no_sync since the last reduction holds
  // that gradient, so it counts as used even if this step skips it.
  std::vector<int> used(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) used[i] = locally_used_[i] || used_since_sync_[i] ? 1 : 0;
  unused_mask_ = at::tensor(used, at::TensorOptions().dtype(at::kInt)).to(params_.front().device());
  unused_mask_work_ = group_.all_reduce_async(unused_mask_);
}

void Reducer::end_step() {
  std::fill(used_since_sync_.begin(), used_since_sync_.end(), false);
  if (!rebuilt_) rebuild_due_ = true;
  mask_due_ = false;
  phase_ = Phase::kIdle;
}

void Reducer::on_gradient_ready(std::size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ == Phase::kNoSync) {  // no_sync: .grad accumulates locally
    used_since_sync_[index] = true;
    return;
  }
  if (phase_ == Phase::kIdle)
    throw ConfigError(fmt::format(
        "cohort DDP (rank {}): parameter '{}' received a gradient outside a DDP step. Run forward through the "
        "DDP wrapper (or call before_forward/after_forward around it) before each backward, and run one "
        "backward per forward",
        group_.rank(), names_[index]));
  if (ready_[index]) {
    if (options_.static_graph() && !static_used_[index])
      throw ConfigError(fmt::format(
          "cohort DDP (rank {}): static_graph(true) was set, but parameter '{}' was unused in the first step "
          "and got a gradient now. The set of used parameters changes between steps: turn static_graph off{}",
          group_.rank(), names_[index],
          options_.find_unused_parameters() ? " (find_unused_parameters is on already and then takes over)"
                                            : " and set find_unused_parameters(true)"));
    throw ConfigError(fmt::format(
        "cohort DDP (rank {}): parameter '{}' received its gradient twice in one step (a second backward "
        "over the same forward, or reentrant backward). Run one backward per DDP forward, or wrap the extra "
        "backward passes in no_sync()",
        group_.rank(), names_[index]));
  }
  hooks_fired_ = true;
  queue_finalize();  // where no output's hook ran first (Note [Where backward ends])
  if (!rebuilt_) arrivals_.push_back(index);
  mark_ready(index);
  if (timed_) note_completions(elapsed());
}

void Reducer::mark_ready(std::size_t index) {
  at::NoGradGuard no_grad;
  ready_[index] = true;
  auto& view = views_[index];
  auto& grad = params_[index].mutable_grad();
  // Note [Divide on the way in]: the bucket receives grad / divisor, fused with the
  // copy, so the reduction is a plain sum and no pass over the bucket is left for
  // after communication, when it could no longer hide behind backward.
  if (identity_) {
    // Note [A group of one]: nothing to copy, the gradient already is the average.
  } else if (!grad.defined()) {
    view.zero_();
  } else if (!grad.is_alias_of(view)) {
    if (divisor_ == 1) view.copy_(grad);
    else at::mul_out(view, grad, inverse_divisor_);
    if (options_.gradient_as_bucket_view()) grad = view;
  } else if (divisor_ != 1) {
    view.mul_(inverse_divisor_);
  }
  auto& bucket = buckets_[plan_.bucket_of[index]];
  if (--bucket.pending == 0) {
    if (timed_) timings_.buckets[plan_.bucket_of[index]].ready_s = elapsed();
    launch_ready_buckets();
  }
}

// Note [Bucket ready order], invariant 3: strictly in plan order.
void Reducer::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    // Riding, the last bucket carries the status, so it waits for it (launch_status).
    if (next_bucket_ + 1 == buckets_.size() && status_.rides() && !status_.launched()) break;
    auto& bucket = buckets_[next_bucket_];
    bucket.in_flight = std::make_shared<GradBucket>(next_bucket_, next_bucket_ + 1 == buckets_.size(),
                                                    bucket.buffer, bucket.views, divisor_,
                                                    plan_.buckets[next_bucket_].params);
    bucket.work = hook_->start(group_, *bucket.in_flight);
    bucket.launched = true;
    if (timed_) timings_.buckets[next_bucket_].launched_s = elapsed();
    ++next_bucket_;
  }
}

bool Reducer::all_ready() const {
  return std::all_of(buckets_.begin(), buckets_.end(), [](const BucketState& b) { return b.pending == 0; });
}

std::vector<std::string> Reducer::names_not_ready() const {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) out.push_back(names_[i]);
  return out;
}

// Note [DDP on the timeline]: the reducer already times each bucket for
// last_timings(); with a recorder (a timeline) it draws them once the step is done, rather than
// from the autograd hooks, so tracing adds no lock or allocation to backward. Each
// bucket is an async event from launch to the first time it was seen complete (at
// a gradient's arrival or at the end), with an instant for when it became ready.
void Reducer::trace_iteration() const {
  auto* recorder = group_.recorder();
  if (!recorder || !recorder->recording()) return;
  const double start_us =
      std::chrono::duration<double, std::micro>(iteration_start_.time_since_epoch()).count();
  auto at = [&](double s) { return start_us + s * 1e6; };
  for (std::size_t b = 0; b < timings_.buckets.size(); ++b) {
    const auto& t = timings_.buckets[b];
    if (t.ready_s >= 0) recorder->instant(fmt::format("bucket {} ready", b), "ddp", at(t.ready_s), t.bytes);
    if (t.launched_s >= 0 && t.done_s >= 0)
      recorder->async(fmt::format("bucket {}", b), "ddp", at(t.launched_s), at(t.done_s), t.bytes);
  }
  if (timings_.backward_end_s >= 0 && timings_.finalize_end_s >= 0)
    recorder->span("ddp wait and copy back", "ddp", at(timings_.backward_end_s), at(timings_.finalize_end_s));
}

double Reducer::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - iteration_start_).count();
}

void Reducer::note_completions(double now) {
  for (std::size_t b = 0; b < next_bucket_; ++b)
    if (timings_.buckets[b].done_s < 0 && buckets_[b].work.is_completed()) timings_.buckets[b].done_s = now;
}

}  // namespace cohort::ddp
