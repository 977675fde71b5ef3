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
    const auto n = flats_[f]->params().size();
    grads_[f].arrived.assign(n, false);
    grads_[f].used.assign(n, false);
    grads_[f].used_local.assign(n, false);
    grads_[f].has_grad.assign(n, false);
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
  if (unit == 0 && !armed_) {
    raise_recorded_failure();
    check_trainable("a forward");
  }
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
      g.used_local[i] = true;
    } else {
      g.used[i] = true;
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
    for (std::size_t i = 0; i < g.used.size(); ++i) g.used[i] = g.used[i] || g.used_local[i];
  }
  std::fill(g.used_local.begin(), g.used_local.end(), false);
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
  std::fill(g.used_local.begin(), g.used_local.end(), false);
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
  grads_[job.flat].grad_was_undefined = !grad.defined();
  if (grad.defined()) {
    grad.add_(sum);  // zeros where no rank used a parameter: .grad is unchanged there
  } else {
    grad = sum;
  }
}

// Note [Unused parameters under ZeRO-3]: every flat is launched; the votes follow
// the reductions in flight, in the same order on every rank.
void ShardSchedule::agree_on_unused() {
  std::int64_t n = 0;
  for (auto f : plan_) n += static_cast<std::int64_t>(grads_[f].used.size());
  if (n == 0) return;
  auto votes = at::zeros({n}, at::TensorOptions().dtype(at::kFloat));
  auto* v = votes.data_ptr<float>();
  std::int64_t k = 0;
  for (auto f : plan_)
    for (bool used : grads_[f].used) v[k++] = used ? 1.0f : 0.0f;
  const auto device = flats_[plan_.front()]->shard().device();
  auto summed = votes.to(device);
  if (group_.size() > 1) group_.all_reduce(summed);
  votes = summed.to(at::kCPU);
  v = votes.data_ptr<float>();
  k = 0;
  for (auto f : plan_)
    for (std::size_t i = 0; i < grads_[f].used.size(); ++i) grads_[f].used[i] = v[k++] > 0;
}

void ShardSchedule::finalize_backward() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (!armed_) return;
  try {
    if (sync_) {
      for (auto f : plan_) complete_[f] = true;
      launch_ready();
      agree_on_unused();
      while (!in_flight_.empty()) {
        land(in_flight_.front());
        in_flight_.pop_front();
      }
      // Note [Unused parameters under ZeRO-3]
      for (auto f : plan_) {
        auto& g = grads_[f];
        if (g.grad_was_undefined) std::fill(g.has_grad.begin(), g.has_grad.end(), false);
        bool any = false;
        for (std::size_t i = 0; i < g.used.size(); ++i) {
          g.has_grad[i] = g.has_grad[i] || g.used[i];
          any = any || g.has_grad[i];
        }
        if (!any) flats_[f]->shard().mutable_grad().reset();  // what it landed is zeros: skipped whole
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
    std::fill(grads_[f].used.begin(), grads_[f].used.end(), false);
    grads_[f].missing = flats_[f]->trainable() ? flats_[f]->params().size() : 0;
    complete_[f] = false;
  }
  forward_order_.clear();
  backward_order_.clear();
}

std::vector<std::pair<std::int64_t, std::int64_t>> ShardSchedule::unused_ranges(std::size_t f) const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  const auto& flat = *flats_.at(f);
  if (!flat.trainable() || !flat.shard().grad().defined()) return out;
  const auto begin = static_cast<std::int64_t>(group_.rank()) * flat.chunk_numel();
  const auto end = begin + flat.chunk_numel();
  for (std::size_t i = 0; i < flat.params().size(); ++i) {
    if (grads_[f].has_grad[i]) continue;
    const auto from = std::max(begin, flat.offset(i));
    const auto to = std::min(end, flat.offset(i) + flat.numel(i));
    if (from < to) out.emplace_back(from - begin, to - from);
  }
  return out;
}

// Note [Unused parameters under ZeRO-3]: a frozen flat has no gradient buffer, no
// hook and no optimizer state, so a parameter unfrozen in it would never train (or
// train on one rank's gradient alone).
void ShardSchedule::check_trainable(const char* where) const {
  for (const auto& flat : flats_) {
    if (flat->trainable()) continue;
    for (std::size_t i = 0; i < flat->params().size(); ++i)
      if (flat->params()[i].requires_grad())
        throw ConfigError(fmt::format(
            "cohort fully_shard (rank {}): parameter '{}' was frozen (requires_grad false) when fully_shard() was "
            "called, and requires grad now, at {}. fully_shard() shards frozen parameters apart from trainable "
            "ones and never reduces their gradients, so the change would be ignored. Fix: set requires_grad on "
            "every parameter before fully_shard(), then build the model, fully_shard() it and make its optimizer "
            "again (load the weights inside full_parameters(true)) to unfreeze it",
            group_.rank(), flat->names()[i], where));
  }
}

void ShardSchedule::record_failure(std::string what) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (failure_.empty()) failure_ = std::move(what);
}

void ShardSchedule::raise_recorded_failure() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (failure_.empty()) return;
  auto what = std::move(failure_);
  failure_.clear();
  throw ConfigError(what);
}

}  // namespace cohort::zero
