#include "cohort/zero/gradient_sharder.h"

#include <ATen/ATen.h>
#include <c10/util/strides.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "cohort/errors.h"

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
  incoming_.resize(trainable_.size());
  local_.assign(trainable_.size(), false);
  set_aside_.resize(trainable_.size());
  pending_.assign(plan_.buckets.size(), 0);
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
  for (std::size_t k = 0; k < accumulators_.size(); ++k) {
    auto& hooks = accumulators_[k]->pre_hooks();
    hooks.erase(std::remove_if(hooks.begin(), hooks.end(),
                               [&](const auto& h) { return static_cast<const void*>(h.get()) == hook_keys_[k]; }),
                hooks.end());
  }
}

void GradientSharder::set_sync(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
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
    // An owner's earlier average is set aside rather than summed over the ranks again.
    if (!local_[k] && grad.defined() && owner(k) == group_.rank()) {
      set_aside_[k] = grad;
      grad.reset();
    }
    local_[k] = true;
    return incoming;
  }
  if (!armed_) arm();
  if (incoming_[k].defined())
    throw ConfigError(fmt::format(
        "cohort ShardedOptimizer (rank {}): parameter {} received its gradient twice in one backward (reentrant "
        "backward, or a second backward over part of the graph); run one backward per forward, or wrap the extra "
        "ones in no_sync()",
        group_.rank(), trainable_[k]));
  at::Tensor contribution = incoming.defined() ? incoming : at::zeros_like(param(k));
  if (local_[k] && grad.defined()) {
    contribution = grad + contribution;
    grad.reset();
  }
  local_[k] = false;
  incoming_[k] = contribution;
  if (--pending_[plan_.bucket_of[k]] == 0) launch_ready_buckets();
  return at::Tensor();  // nothing for autograd to accumulate
}

void GradientSharder::arm() {
  armed_ = true;
  next_bucket_ = 0;
  for (std::size_t b = 0; b < plan_.buckets.size(); ++b) pending_[b] = plan_.buckets[b].params.size();
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize_backward(); });
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
  const auto& members = plan_.buckets[bucket].params;
  std::vector<int> owners;
  for (auto k : members) owners.push_back(owner(k));
  std::sort(owners.begin(), owners.end());
  owners.erase(std::unique(owners.begin(), owners.end()), owners.end());
  for (int o : owners) {
    InFlight f{bucket, o, {}, {}, {}};
    std::vector<at::Tensor> pieces;
    for (auto k : members) {
      if (owner(k) != o) continue;
      f.members.push_back(k);
      pieces.push_back(incoming_[k].reshape(-1));
      incoming_[k] = at::Tensor();
    }
    // Note [Divide on the way in] (ddp/reducer.cpp): the same multiplication as DDP's.
    f.flat = at::cat(pieces).mul_(inverse_world_);
    f.pending = group_.reduce_async(f.flat, o);
    in_flight_.push_back(std::move(f));
  }
}

void GradientSharder::land(InFlight& f) {
  f.pending.wait();
  if (f.owner != group_.rank()) return;  // the flat (this rank's contribution) is dropped
  at::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (auto k : f.members) {
    auto& p = param(k);
    auto sum = alias(f.flat, offset, p.sizes());
    offset += p.numel();
    auto& grad = p.mutable_grad();
    if (set_aside_[k].defined()) {
      grad = set_aside_[k].add_(sum);
      set_aside_[k] = at::Tensor();
    } else if (grad.defined()) {
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
    for (std::size_t b = next_bucket_; b < plan_.buckets.size(); ++b) {
      for (auto k : plan_.buckets[b].params) {
        if (incoming_[k].defined()) continue;
        auto& grad = param(k).mutable_grad();
        if (local_[k] && grad.defined()) {
          incoming_[k] = grad;
          grad.reset();
        } else {
          incoming_[k] = at::zeros_like(param(k));
        }
        local_[k] = false;
      }
      pending_[b] = 0;
    }
    launch_ready_buckets();
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
  for (auto& t : incoming_) t = at::Tensor();
}

void GradientSharder::check_before_step() const {
  std::lock_guard<std::mutex> lock(mutex_);
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
