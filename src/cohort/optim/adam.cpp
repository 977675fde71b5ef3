#include "cohort/optim/adam.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "cohort/compat/fused_optimizer.h"
#include "cohort/compat/optimizer.h"
#include "cohort/optim/capturable.h"
#include "cohort/optim/tensor_lists.h"

namespace cohort::optim {

namespace {

struct Hyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad;
  bool decoupled;  // AdamW: the decay scales the weights, not the gradient
};

template <class Options>
Hyper hyper_of(const torch::optim::OptimizerOptions& options, bool decoupled) {
  const auto& o = static_cast<const Options&>(options);
  return {o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(), o.amsgrad(), decoupled};
}

// The moments of one list, as the kernels take them.
struct Moments {
  std::vector<at::Tensor> exp_avg, exp_avg_sq, max_exp_avg_sq;
};

// torch::optim's own arithmetic, operator for operator, so that the result is its to
// the bit (the parity test holds this path to equality).
void for_loop_step(const std::vector<at::Tensor>& params, const Moments& m, std::int64_t step, const Hyper& h) {
  const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(h.beta2, static_cast<double>(step));
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto p = params[i];
    auto grad = p.grad();
    if (h.decoupled && h.weight_decay != 0) p.mul_(1 - h.lr * h.weight_decay);
    if (!h.decoupled && h.weight_decay != 0) grad = grad.add(p, h.weight_decay);
    m.exp_avg[i].mul_(h.beta1).add_(grad, 1 - h.beta1);
    m.exp_avg_sq[i].mul_(h.beta2).addcmul_(grad, grad, 1 - h.beta2);
    at::Tensor denom;
    if (h.amsgrad) {
      auto max = m.max_exp_avg_sq[i];
      at::max_out(max, m.exp_avg_sq[i], max);
      denom = (m.max_exp_avg_sq[i].sqrt() / std::sqrt(bc2)).add_(h.eps);
    } else {
      denom = (m.exp_avg_sq[i].sqrt() / std::sqrt(bc2)).add_(h.eps);
    }
    p.addcdiv_(m.exp_avg[i], denom, -h.lr / bc1);
  }
}

// The same arithmetic, each operator once over the list.
void foreach_step(const std::vector<at::Tensor>& params, const Moments& m, std::int64_t step, const Hyper& h) {
  const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(h.beta2, static_cast<double>(step));
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) grads.push_back(p.grad());
  if (h.decoupled && h.weight_decay != 0) at::_foreach_mul_(params, 1 - h.lr * h.weight_decay);
  if (!h.decoupled && h.weight_decay != 0) grads = at::_foreach_add(grads, params, h.weight_decay);
  at::_foreach_mul_(m.exp_avg, h.beta1);
  at::_foreach_add_(m.exp_avg, grads, 1 - h.beta1);
  at::_foreach_mul_(m.exp_avg_sq, h.beta2);
  at::_foreach_addcmul_(m.exp_avg_sq, grads, grads, 1 - h.beta2);
  if (h.amsgrad)
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto max = m.max_exp_avg_sq[i];
      at::max_out(max, m.exp_avg_sq[i], max);
    }
  auto denom = at::_foreach_sqrt(h.amsgrad ? m.max_exp_avg_sq : m.exp_avg_sq);
  at::_foreach_div_(denom, std::sqrt(bc2));
  at::_foreach_add_(denom, h.eps);
  at::_foreach_addcdiv_(params, m.exp_avg, denom, -h.lr / bc1);
}

// Capturable (Note [A step inside a CUDA graph]): the learning rate and the step
// counts come from the device.
void capturable_step(const std::vector<at::Tensor>& params, const Moments& m, const std::vector<at::Tensor>& steps,
                     const at::Tensor& lr, const Hyper& h) {
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) grads.push_back(p.grad());
  compat::fused_adam_(params, grads, m.exp_avg, m.exp_avg_sq, h.amsgrad ? m.max_exp_avg_sq : std::vector<at::Tensor>{},
                      steps, lr, h.beta1, h.beta2, h.weight_decay, h.eps, h.amsgrad, h.decoupled);
}

void fused_step(const std::vector<at::Tensor>& params, const Moments& m, std::int64_t step, const Hyper& h) {
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) grads.push_back(p.grad());
  // Note [Fused step counts] (compat/fused_optimizer.h): one count for the list.
  const auto count = at::full({}, static_cast<double>(step), params.front().options().dtype(at::kFloat));
  const std::vector<at::Tensor> steps(params.size(), count);
  compat::fused_adam_(params, grads, m.exp_avg, m.exp_avg_sq, h.amsgrad ? m.max_exp_avg_sq : std::vector<at::Tensor>{},
                      steps, h.lr, h.beta1, h.beta2, h.weight_decay, h.eps, h.amsgrad, h.decoupled);
}

// Both optimizers' step: State is AdamParamState or AdamWParamState, which have the
// same fields and are kept apart so that each optimizer's state dicts stay its own.
template <class State>
at::Tensor adam_step(torch::optim::Optimizer& self, const torch::optim::Optimizer::LossClosure& closure,
                     StepKernel wanted, const char* who,
                     Hyper (*hyper)(const torch::optim::OptimizerOptions&), DeviceStepState& device) {
  at::NoGradGuard no_grad;
  auto loss = run_closure(closure);
  for (std::size_t g = 0; g < self.param_groups().size(); ++g) {
    auto& group = self.param_groups()[g];
    const auto h = hyper(group.options());
    const auto params = params_with_grads(group, who);
    std::vector<State*> states;
    states.reserve(params.size());
    for (const auto& p : params) {
      auto& slot = self.state()[compat::optimizer_state_key(p)];
      if (!slot) {
        auto made = std::make_unique<State>();
        made->step(0);
        made->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        made->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(made);
      }
      auto* s = static_cast<State*>(slot.get());
      // amsgrad turned on after the state was made: its maximum starts at zero.
      if (h.amsgrad && !s->max_exp_avg_sq().defined()) s->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      s->step(s->step() + 1);
      states.push_back(s);
    }
    for (const auto& list : split_lists(params, [&](std::size_t i) { return states[i]->step(); })) {
      const auto members = pick(params, list);
      Moments m;
      for (auto i : list.members) {
        m.exp_avg.push_back(states[i]->exp_avg());
        m.exp_avg_sq.push_back(states[i]->exp_avg_sq());
        if (h.amsgrad) m.max_exp_avg_sq.push_back(states[i]->max_exp_avg_sq());
      }
      if (device.on) {
        resolve(StepKernel::fused, list.device, list.dtype);  // throws, naming the fix, where there is none
        const std::vector<std::int64_t> before(list.members.size(), list.extra - 1);
        capturable_step(members, m, advance_device_steps(device, members, before),
                        learning_rate_tensor(device, g, who), h);
        continue;
      }
      switch (resolve(wanted, list.device, list.dtype)) {
        case StepKernel::fused: fused_step(members, m, list.extra, h); break;
        case StepKernel::foreach: foreach_step(members, m, list.extra, h); break;
        default: for_loop_step(members, m, list.extra, h); break;
      }
    }
  }
  return loss;
}

Hyper adam_hyper(const torch::optim::OptimizerOptions& o) { return hyper_of<torch::optim::AdamOptions>(o, false); }
Hyper adamw_hyper(const torch::optim::OptimizerOptions& o) { return hyper_of<torch::optim::AdamWOptions>(o, true); }

template <class State>
void add_to_counts(torch::optim::Optimizer& self, int delta) {
  for (auto& group : self.param_groups())
    for (const auto& p : group.params()) {
      auto it = self.state().find(compat::optimizer_state_key(p));
      if (it == self.state().end() || !it->second) continue;
      auto& s = static_cast<State&>(*it->second);
      s.step(s.step() + delta);
    }
}

}  // namespace

Adam::Adam(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamOptions defaults,
           StepKernel kernel)
    : torch::optim::Adam(std::move(groups), defaults), kernel_(kernel) {}
Adam::Adam(std::vector<at::Tensor> params, torch::optim::AdamOptions defaults, StepKernel kernel)
    : torch::optim::Adam(std::move(params), defaults), kernel_(kernel) {}
at::Tensor Adam::step(LossClosure closure) {
  return adam_step<torch::optim::AdamParamState>(*this, closure, kernel_, "Adam", adam_hyper, device_);
}
Adam& Adam::capturable(bool on) {
  set_capturable(device_, on, kernel_, "Adam");
  return *this;
}
void Adam::load_learning_rates() { optim::load_learning_rates(*this, device_); }
void Adam::count_steps(int delta) { add_to_counts<torch::optim::AdamParamState>(*this, delta); }
void Adam::reset_device_state() { device_ = DeviceStepState{device_.on}; }

AdamW::AdamW(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions defaults,
             StepKernel kernel)
    : torch::optim::AdamW(std::move(groups), defaults), kernel_(kernel) {}
AdamW::AdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults, StepKernel kernel)
    : torch::optim::AdamW(std::move(params), defaults), kernel_(kernel) {}
at::Tensor AdamW::step(LossClosure closure) {
  return adam_step<torch::optim::AdamWParamState>(*this, closure, kernel_, "AdamW", adamw_hyper, device_);
}
AdamW& AdamW::capturable(bool on) {
  set_capturable(device_, on, kernel_, "AdamW");
  return *this;
}
void AdamW::load_learning_rates() { optim::load_learning_rates(*this, device_); }
void AdamW::count_steps(int delta) { add_to_counts<torch::optim::AdamWParamState>(*this, delta); }
void AdamW::reset_device_state() { device_ = DeviceStepState{device_.on}; }

}  // namespace cohort::optim
