#include "cohort/zero/shard_schedule.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "cohort/errors.h"
#include "cohort/zero/pre_hooks.h"

namespace cohort::zero {
namespace {

// Runs before a parameter's AccumulateGrad node (Note [ZeRO-3 schedule], 2): what it
// returns is what autograd accumulates into the original parameter: nothing.
class TakeGradient : public torch::autograd::FunctionPreHook {
 public:
  TakeGradient(std::weak_ptr<ShardSchedule> schedule, std::size_t flat, std::size_t param)
      : schedule_(std::move(schedule)), flat_(flat), param_(param) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    auto schedule = schedule_.lock();
    if (!schedule) return grads;
    return {schedule->take(flat_, param_, grads.at(0))};
  }

 private:
  std::weak_ptr<ShardSchedule> schedule_;
  std::size_t flat_;
  std::size_t param_;
};

}  // namespace

ShardSchedule::ShardSchedule(comm::Group group, FullyShardOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  inverse_world_ = at::scalar_tensor(1.0 / group_.size(), at::TensorOptions().dtype(at::kDouble));
}

ShardSchedule::~ShardSchedule() {
  for (std::size_t k = 0; k < accumulators_.size(); ++k) remove_pre_hook(*accumulators_[k], hook_keys_[k]);
}

void ShardSchedule::add_unit(std::string name, std::vector<std::unique_ptr<FlatParameter>> flats) {
  Unit unit{std::move(name), {}};
  for (auto& f : flats) {
    unit.flats.push_back(flats_.size());
    unit_of_.push_back(units_.size());
    flats_.push_back(std::move(f));
  }
  units_.push_back(std::move(unit));
}

void ShardSchedule::start() {
  // Note [ZeRO-3 schedule], 3: units in reverse pre-order, each unit's flats in order.
  for (std::size_t u = units_.size(); u-- > 0;)
    for (auto f : units_[u].flats)
      if (flats_[f]->trainable()) plan_.push_back(f);
  grads_.resize(flats_.size());
  complete_.assign(flats_.size(), false);
  for (std::size_t f = 0; f < flats_.size(); ++f) {
    grads_[f].arrived.assign(flats_[f]->params().size(), false);
    if (!flats_[f]->trainable()) continue;
    for (std::size_t i = 0; i < flats_[f]->params().size(); ++i) {
      auto acc = flats_[f]->accumulator(i);
      auto hook = std::make_unique<TakeGradient>(weak_from_this(), f, i);
      hook_keys_.push_back(hook.get());
      acc->add_pre_hook(std::move(hook));
      accumulators_.push_back(std::move(acc));
    }
  }
  reset_iteration();
}

void ShardSchedule::set_sync(bool sync) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  drop_abandoned_backward();
  if (armed_)
    throw ConfigError("cohort fully_shard: no_sync() was entered or left during a backward; enter it before the "
                      "forward whose backward should not synchronise");
  sync_ = sync;
}

bool ShardSchedule::sync() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  return sync_;
}

at::ScalarType ShardSchedule::reduce_dtype(const FlatParameter& flat) const {
  if (!at::isFloatingType(flat.shard().scalar_type())) return flat.shard().scalar_type();
  if (options_.reduce_dtype()) return *options_.reduce_dtype();
  return flat.compute_dtype();
}

void ShardSchedule::gather(std::size_t unit) {
  for (auto f : units_[unit].flats) flats_[f]->start_gather();
  for (auto f : units_[unit].flats) flats_[f]->finish_gather();
}

// The unit that followed `unit` in `order` (the previous iteration's) starts gathering.
void ShardSchedule::prefetch_after(std::size_t unit, const std::vector<std::size_t>& order) {
  if (!options_.prefetch()) return;
  auto it = std::find(order.begin(), order.end(), unit);
  if (it == order.end() || ++it == order.end()) return;
  for (auto f : units_[*it].flats) flats_[f]->start_gather();
}

void ShardSchedule::reshard(std::size_t unit, bool frozen_too) {
  for (auto f : units_[unit].flats)
    if (frozen_too || flats_[f]->trainable()) flats_[f]->reshard();
}

void ShardSchedule::reshard_all(const char* why) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  drop_abandoned_backward();
  if (armed_)
    throw ConfigError(fmt::format("cohort fully_shard: {} during a backward; call it between steps", why));
  for (std::size_t u = 0; u < units_.size(); ++u) reshard(u, true);
}

void ShardSchedule::invalidate_all() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  for (auto& f : flats_) f->invalidate();
}

void ShardSchedule::pre_forward(std::size_t unit) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  drop_abandoned_backward();
  // Note [Fresh gathers]: nothing from before this forward (and a step) is reused.
  if (unit == 0 && !armed_)
    for (std::size_t u = 0; u < units_.size(); ++u) reshard(u, true);
  if (!armed_ && at::GradMode::is_enabled()) {  // training forwards only: evaluation has no backward
    if (unit == 0) forward_order_.clear();
    forward_order_.push_back(unit);
  }
  gather(unit);
  prefetch_after(unit, last_forward_order_);
}

void ShardSchedule::post_forward(std::size_t unit, const std::vector<at::Tensor>& outputs, bool opaque) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  bool hooked = false;
  if (at::GradMode::is_enabled()) {
    std::weak_ptr<ShardSchedule> weak = weak_from_this();
    for (const auto& out : outputs) {
      if (!out.defined() || !out.requires_grad()) continue;
      out.register_hook([weak, unit](const at::Tensor&) {
        if (auto schedule = weak.lock()) schedule->pre_backward(unit);
      });
      hooked = true;
    }
  }
  if (opaque && at::GradMode::is_enabled()) return;  // Note [ZeRO-3 schedule], 1
  if (unit == 0 && !hooked && !armed_) {
    // Note [Fresh gathers]: no backward follows; a prefetch left in flight goes too.
    for (std::size_t u = 0; u < units_.size(); ++u) reshard(u, true);
    return;
  }
  if (!hooked || (unit != 0 && options_.reshard_after_forward())) reshard(unit, true);
}

void ShardSchedule::pre_backward(std::size_t unit) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  drop_abandoned_backward();
  if (!armed_) arm();
  if (std::find(backward_order_.begin(), backward_order_.end(), unit) != backward_order_.end()) return;
  backward_order_.push_back(unit);
  gather(unit);
  prefetch_after(unit, last_backward_order_);
}

void ShardSchedule::arm() {
  armed_ = true;
  next_launch_ = 0;
  auto token = std::make_shared<char>();
  backward_token_ = token;
  std::weak_ptr<ShardSchedule> weak = weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([weak, token] {
    (void)token;  // held, not used: its lifetime is the signal
    if (auto schedule = weak.lock()) schedule->finalize_backward();
  });
}

void ShardSchedule::drop_abandoned_backward() {
  if (armed_ && backward_token_.expired()) reset_iteration();
}

at::Tensor ShardSchedule::take(std::size_t f, std::size_t i, const at::Tensor& grad) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  drop_abandoned_backward();
  if (!armed_) arm();
  auto& g = grads_[f];
  const auto& flat = *flats_[f];
  if (g.arrived[i])
    throw ConfigError(fmt::format(
        "cohort fully_shard (rank {}): parameter '{}' received its gradient twice in one backward (reentrant "
        "backward, or a second backward over part of the graph); run one backward per forward",
        group_.rank(), flat.names()[i]));
  at::NoGradGuard no_grad;
  const auto n = flat.numel(i);
  if (grad.defined()) {
    if (!sync_) {
      drop_cleared_local(f);
      if (!g.local.defined()) {
        g.local = at::zeros({flat.padded_numel()}, grad.options());
        auto shard = flat.shard();
        auto& sg = shard.mutable_grad();
        if (!sg.defined()) sg = at::zeros_like(shard);
        g.grad_impl = sg.unsafeGetTensorImpl();
        g.grad_version = sg._version();
      }
      g.local.narrow(0, flat.offset(i), n).add_(grad.reshape({-1}));
    } else {
      if (!g.flat.defined())
        g.flat = at::zeros({flat.padded_numel()}, flat.shard().options().dtype(reduce_dtype(flat)));
      g.flat.narrow(0, flat.offset(i), n).copy_(grad.reshape({-1}));
    }
  }
  g.arrived[i] = true;
  if (--g.missing == 0) {
    complete_[f] = true;
    if (sync_) launch_ready();
    const auto unit = unit_of_[f];
    bool all = true;
    for (auto u : units_[unit].flats)
      if (flats_[u]->trainable() && !complete_[u]) all = false;
    if (all) reshard(unit, false);
  }
  return at::Tensor();
}

// Note [Bucket ready order], invariant 3: strictly in plan order on every rank.
void ShardSchedule::launch_ready() {
  while (next_launch_ < plan_.size() && complete_[plan_[next_launch_]]) {
    launch(plan_[next_launch_++]);
    while (in_flight_.size() > 2) {
      land(in_flight_.front());
      in_flight_.pop_front();
    }
  }
}

void ShardSchedule::launch(std::size_t f) {
  auto& g = grads_[f];
  const auto& flat = *flats_[f];
  at::NoGradGuard no_grad;
  if (!g.flat.defined()) g.flat = at::zeros({flat.padded_numel()}, flat.shard().options().dtype(reduce_dtype(flat)));
  drop_cleared_local(f);
  if (g.local.defined()) {
    g.flat.add_(g.local);
    g.local = at::Tensor();
  }
  g.flat.mul_(inverse_world_);
  InFlight job;
  job.flat = f;
  job.input = std::move(g.flat);
  g.flat = at::Tensor();
  job.output = at::empty({flat.chunk_numel()}, job.input.options());
  job.pending = group_.reduce_scatter_async(job.input, job.output);
  in_flight_.push_back(std::move(job));
}

// Note [no_sync and zero_grad]
void ShardSchedule::drop_cleared_local(std::size_t f) {
  auto& g = grads_[f];
  if (!g.local.defined()) return;
  const auto& sg = flats_[f]->shard().grad();
  if (sg.defined() && sg.unsafeGetTensorImpl() == g.grad_impl && sg._version() == g.grad_version) return;
  g.local = at::Tensor();
}

bool ShardSchedule::aliases(std::size_t unit, const at::Tensor& t) const {
  for (auto f : units_[unit].flats)
    if (flats_[f]->holds(t)) return true;
  return false;
}

void ShardSchedule::land(InFlight& job) {
  job.pending.wait();
  at::NoGradGuard no_grad;
  auto shard = flats_[job.flat]->shard();
  auto sum = job.output.to(shard.scalar_type());
  auto& grad = shard.mutable_grad();
  if (grad.defined()) {
    grad.add_(sum);
  } else {
    grad = sum;
  }
}

void ShardSchedule::finalize_backward() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (!armed_) return;
  try {
    if (sync_) {
      for (auto f : plan_) complete_[f] = true;
      launch_ready();
      while (!in_flight_.empty()) {
        land(in_flight_.front());
        in_flight_.pop_front();
      }
    }
    for (std::size_t u = 0; u < units_.size(); ++u) reshard(u, true);
  } catch (...) {
    reset_iteration();
    throw;
  }
  last_forward_order_ = forward_order_;
  last_backward_order_ = backward_order_;
  reset_iteration();
}

void ShardSchedule::reset_iteration() {
  armed_ = false;
  next_launch_ = 0;
  in_flight_.clear();
  for (std::size_t f = 0; f < flats_.size(); ++f) {
    grads_[f].flat = at::Tensor();
    std::fill(grads_[f].arrived.begin(), grads_[f].arrived.end(), false);
    grads_[f].missing = flats_[f]->trainable() ? flats_[f]->params().size() : 0;
    complete_[f] = false;
  }
  forward_order_.clear();
  backward_order_.clear();
}

}  // namespace cohort::zero
