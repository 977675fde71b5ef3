#include "cohort/zero/gradient_sharder.h"

#include <ATen/ATen.h>
#include <c10/util/strides.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "cohort/errors.h"
#include "cohort/zero/pre_hooks.h"

namespace cohort::zero {
namespace {

// Runs before a parameter's AccumulateGrad node (Note [ZeRO-2 gradients]); what it
// returns is what autograd accumulates: nothing, in a synchronised backward.
class TakeGradient : public torch::autograd::FunctionPreHook {
 public:
  TakeGradient(GradientSharder* sharder, std::size_t k) : sharder_(sharder), k_(k) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    return {sharder_->take(k_, grads.at(0))};
  }

 private:
  GradientSharder* sharder_;
  std::size_t k_;
};

// `sizes` elements of `flat` from `offset`, as an ordinary tensor sharing its memory
// (Note [Gradients that alias a bucket] in ddp/reducer.cpp: LibTorch 1.13's
// zero_grad() detaches .grad in place, which autograd refuses on a view).
at::Tensor alias(const at::Tensor& flat, std::int64_t offset, at::IntArrayRef sizes) {
  auto out = at::empty({0}, flat.options());
  out.set_(flat.storage(), flat.storage_offset() + offset, sizes, c10::contiguous_strides(sizes));
  return out;
}

}  // namespace

GradientSharder::GradientSharder(std::vector<at::Tensor> params, std::vector<int> owners, comm::Group group,
                                 std::int64_t bucket_cap_bytes)
    : params_(std::move(params)), owners_(std::move(owners)), group_(std::move(group)) {
  TORCH_INTERNAL_ASSERT(params_.size() == owners_.size());
  inverse_world_ = at::scalar_tensor(1.0 / group_.size(), at::TensorOptions().dtype(at::kDouble));
  std::vector<ddp::ParamMeta> metas;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    if (!p.requires_grad()) continue;
    trainable_.push_back(i);
    metas.push_back({fmt::format("parameter {}", i), p.numel(), static_cast<std::int64_t>(p.element_size()),
                     std::string(c10::toString(p.scalar_type())), p.device().str()});
  }
  if (!trainable_.empty())
    plan_ = ddp::plan_buckets(metas, ddp::reverse_registration_order(metas.size()),
                              ddp::BucketOptions().bucket_cap_bytes(bucket_cap_bytes).first_bucket_cap_bytes(
                                  bucket_cap_bytes));
  // Each bucket's parameters grouped by owner, owners ascending, in plan order within.
  place_.resize(trainable_.size());
  for (std::size_t b = 0; b < plan_.buckets.size(); ++b) {
    std::vector<OwnerSlice> slices;
    for (auto k : plan_.buckets[b].params) {
      auto it = std::find_if(slices.begin(), slices.end(), [&](const auto& s) { return s.owner == owner(k); });
      if (it == slices.end()) it = slices.insert(slices.end(), OwnerSlice{owner(k), {}, {}, 0});
      place_[k] = {static_cast<std::size_t>(it - slices.begin()), it->members.size()};
      it->members.push_back(k);
      it->offsets.push_back(it->numel);
      it->numel += param(k).numel();
    }
    // Owners ascending, the order every rank issues the reduces in.
    std::vector<std::size_t> order(slices.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](auto x, auto y) { return slices[x].owner < slices[y].owner; });
    std::vector<OwnerSlice> sorted;
    for (auto i : order) sorted.push_back(std::move(slices[i]));
    for (std::size_t i = 0; i < sorted.size(); ++i)
      for (auto k : sorted[i].members) place_[k].first = i;
    layout_.push_back(std::move(sorted));
  }
  ready_.assign(trainable_.size(), false);
  local_.assign(trainable_.size(), false);
  pending_.assign(plan_.buckets.size(), 0);
  filling_.resize(plan_.buckets.size());
  for (std::size_t k = 0; k < trainable_.size(); ++k) {
    auto acc = torch::autograd::impl::grad_accumulator(param(k));
    TORCH_INTERNAL_ASSERT(acc, "a leaf parameter that requires grad has a gradient accumulator");
    auto hook = std::make_unique<TakeGradient>(this, k);
    hook_keys_.push_back(hook.get());
    acc->add_pre_hook(std::move(hook));
    accumulators_.push_back(std::move(acc));
  }
}

GradientSharder::~GradientSharder() {
  for (std::size_t k = 0; k < accumulators_.size(); ++k) remove_pre_hook(*accumulators_[k], hook_keys_[k]);
}

void GradientSharder::set_sync(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  drop_abandoned_backward();
  if (armed_)
    throw ConfigError("cohort ShardedOptimizer: no_sync() was entered or left during a backward; enter it before "
                      "the forward whose backward should not synchronise");
  sync_ = sync;
}

bool GradientSharder::sync() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sync_;
}

at::Tensor GradientSharder::take(std::size_t k, const at::Tensor& incoming) {
  std::lock_guard<std::mutex> lock(mutex_);
  at::NoGradGuard no_grad;
  auto& grad = param(k).mutable_grad();
  if (!sync_) {
    // Note [ZeRO-2 gradients]: an owner's average from an earlier synchronised
    // backward would be summed over the ranks again; zeros (zero_grad) are harmless.
    if (!local_[k] && grad.defined() && owner(k) == group_.rank() && grad.count_nonzero().item<std::int64_t>() > 0)
      throw ConfigError(fmt::format(
          "cohort ShardedOptimizer (rank {}): parameter {} still holds the average of an earlier synchronised "
          "backward, and no_sync() would add local gradients to it. Call zero_grad() after step() and before the "
          "next accumulation (each iteration: zero_grad; backward under no_sync for all micro-batches but the last; "
          "backward; step)",
          group_.rank(), trainable_[k]));
    local_[k] = true;
    return incoming;
  }
  drop_abandoned_backward();
  if (!armed_) arm();
  if (ready_[k])
    throw ConfigError(fmt::format(
        "cohort ShardedOptimizer (rank {}): parameter {} received its gradient twice in one backward (reentrant "
        "backward, or a second backward over part of the graph); run one backward per forward, or wrap the extra "
        "ones in no_sync()",
        group_.rank(), trainable_[k]));
  if (local_[k] && grad.defined()) {
    fill(k, grad, incoming);
    grad.reset();
  } else {
    fill(k, incoming, at::Tensor());
  }
  mark_ready(k);
  return at::Tensor();  // nothing for autograd to accumulate
}

void GradientSharder::arm() {
  armed_ = true;
  next_bucket_ = 0;
  for (std::size_t b = 0; b < plan_.buckets.size(); ++b) pending_[b] = plan_.buckets[b].params.size();
  // Note [An abandoned backward]: the callback owns the token, the sharder watches it.
  auto token = std::make_shared<char>();
  backward_token_ = token;
  torch::autograd::Engine::get_default_engine().queue_callback([this, token] {
    (void)token;  // held, not used: its lifetime is the signal
    finalize_backward();
  });
}

// Note [An abandoned backward]
// Autograd runs a backward's final callbacks only when the backward succeeds. One
// that threw part-way (an error in a user's function, a refused input) never calls
// finalize_backward(), and the sharder would stay armed: every later backward would
// look like a second gradient in the same one. The queued callback owns a token; when
// the failed backward's graph task is destroyed, the token goes with it, and the next
// hook to fire finds the sharder armed by a backward that no longer exists. What it
// launched is dropped: if every rank failed at the same point (the same bad input),
// the ranks stay paired; if only some did, the others' next collective times out,
// naming the operation (docs/zero.md, Limits).
void GradientSharder::drop_abandoned_backward() {
  if (armed_ && backward_token_.expired()) reset_iteration();
}

void GradientSharder::fill(std::size_t k, const at::Tensor& a, const at::Tensor& b) {
  const auto bucket = plan_.bucket_of[k];
  const auto [slice, position] = place_[k];
  auto& flats = filling_[bucket];
  if (flats.empty())
    for (const auto& s : layout_[bucket])
      flats.push_back(at::empty({s.numel + static_cast<std::int64_t>(s.members.size())}, param(k).options()));
  const auto& p = param(k);
  const auto& s = layout_[bucket][slice];
  // Note [Unused parameters under ZeRO-2]: this rank's vote that k has a gradient.
  flats[slice].narrow(0, s.numel + static_cast<std::int64_t>(position), 1).fill_(a.defined() || b.defined() ? 1 : 0);
  auto view = alias(flats[slice], s.offsets[position], p.sizes());
  // Note [Divide on the way in] (ddp/reducer.cpp): the same operations as DDP's.
  if (a.defined() && b.defined()) {
    at::add_out(view, a, b);
    view.mul_(inverse_world_);
  } else if (a.defined() || b.defined()) {
    at::mul_out(view, a.defined() ? a : b, inverse_world_);
  } else {
    view.zero_();
  }
}

void GradientSharder::mark_ready(std::size_t k) {
  ready_[k] = true;
  local_[k] = false;
  if (--pending_[plan_.bucket_of[k]] == 0) launch_ready_buckets();
}

// Note [Bucket ready order], invariant 3: strictly in plan order on every rank.
void GradientSharder::launch_ready_buckets() {
  while (next_bucket_ < plan_.buckets.size() && pending_[next_bucket_] == 0) {
    launch(next_bucket_);
    ++next_bucket_;
    while (!in_flight_.empty() && in_flight_.front().bucket + 2 < next_bucket_) {
      land(in_flight_.front());
      in_flight_.pop_front();
    }
  }
}

void GradientSharder::launch(std::size_t bucket) {
  auto flats = std::move(filling_[bucket]);
  filling_[bucket].clear();
  for (std::size_t i = 0; i < flats.size(); ++i) {
    InFlight f{bucket, i, std::move(flats[i]), {}};
    f.pending = group_.reduce_async(f.flat, layout_[bucket][i].owner);
    in_flight_.push_back(std::move(f));
  }
}

void GradientSharder::land(InFlight& f) {
  f.pending.wait();
  const auto& slice = layout_[f.bucket][f.slice];
  if (slice.owner != group_.rank()) return;  // the flat (this rank's contribution) is dropped
  at::NoGradGuard no_grad;
  // Note [Unused parameters under ZeRO-2]: how many ranks gave each member a gradient.
  const auto votes = f.flat.narrow(0, slice.numel, static_cast<std::int64_t>(slice.members.size()))
                         .to(at::kCPU, at::kFloat);
  const auto* voted = votes.data_ptr<float>();
  for (std::size_t m = 0; m < slice.members.size(); ++m) {
    const auto k = slice.members[m];
    if (!(voted[m] > 0)) continue;  // no rank used it: its .grad stays as it was
    auto& p = param(k);
    auto sum = alias(f.flat, slice.offsets[m], p.sizes());
    auto& grad = p.mutable_grad();
    if (grad.defined()) {
      grad.add_(sum);
    } else {
      grad = sum;
    }
  }
}

void GradientSharder::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;
  at::NoGradGuard no_grad;
  try {
    // Parameters without a gradient in this backward: their local sum, or zeros.
    for (std::size_t k = 0; k < trainable_.size(); ++k) {
      if (ready_[k]) continue;
      auto& grad = param(k).mutable_grad();
      fill(k, local_[k] ? grad : at::Tensor(), at::Tensor());
      if (local_[k]) grad.reset();
      mark_ready(k);
    }
    while (!in_flight_.empty()) {
      land(in_flight_.front());
      in_flight_.pop_front();
    }
  } catch (...) {
    reset_iteration();
    throw;
  }
  reset_iteration();
}

void GradientSharder::reset_iteration() {
  armed_ = false;
  in_flight_.clear();
  for (auto& f : filling_) f.clear();
  std::fill(ready_.begin(), ready_.end(), false);
}

void GradientSharder::check_before_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  drop_abandoned_backward();
  if (armed_)
    throw ConfigError(fmt::format(
        "cohort ShardedOptimizer (rank {}): step() was called while a backward's gradient reduction is unfinished "
        "(the backward failed part-way, or step() ran inside it); its gradients are incomplete",
        group_.rank()));
  for (std::size_t k = 0; k < trainable_.size(); ++k) {
    const auto& p = params_[trainable_[k]];
    if (owners_[trainable_[k]] == group_.rank() || local_[k] || !p.grad().defined()) continue;
    throw ConfigError(fmt::format(
        "cohort ShardedOptimizer (rank {}): parameter {} is owned by rank {}, yet holds a gradient on this rank "
        "after a synchronised backward. With shard_gradients(true) the optimizer reduces each gradient to its "
        "owner itself: do not also wrap the model in DDP, and do not write .grad by hand",
        group_.rank(), trainable_[k], owners_[trainable_[k]]));
  }
}

std::int64_t GradientSharder::local_gradient_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& p : params_)
    if (p.grad().defined()) bytes += static_cast<std::int64_t>(p.grad().nbytes());
  return bytes;
}

}  // namespace cohort::zero
