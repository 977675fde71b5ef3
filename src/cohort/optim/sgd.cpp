#include "cohort/optim/sgd.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "cohort/compat/fused_optimizer.h"
#include "cohort/compat/optimizer.h"
#include "cohort/optim/tensor_lists.h"

namespace cohort::optim {

namespace {

// One list's tensors. `buffers` are the momentum buffers, empty without momentum;
// `first` when none existed before this step (they are made here).
struct SgdList {
  std::vector<at::Tensor> params, grads, buffers;
  bool first = false;
};

// torch::optim::SGD's arithmetic, operator for operator.
void for_loop_step(SgdList& l, const torch::optim::SGDOptions& o) {
  for (std::size_t i = 0; i < l.params.size(); ++i) {
    auto d_p = l.grads[i];
    if (o.weight_decay() != 0) d_p = d_p.add(l.params[i], o.weight_decay());
    if (o.momentum() != 0) {
      if (l.first) {
        l.buffers[i].copy_(d_p);
      } else {
        l.buffers[i].mul_(o.momentum()).add_(d_p, 1 - o.dampening());
      }
      d_p = o.nesterov() ? d_p.add(l.buffers[i], o.momentum()) : l.buffers[i];
    }
    l.params[i].add_(d_p, -o.lr());
  }
}

void foreach_step(SgdList& l, const torch::optim::SGDOptions& o) {
  auto d_p = l.grads;
  if (o.weight_decay() != 0) d_p = at::_foreach_add(d_p, l.params, o.weight_decay());
  if (o.momentum() != 0) {
    if (l.first) {
      for (std::size_t i = 0; i < l.buffers.size(); ++i) l.buffers[i].copy_(d_p[i]);
    } else {
      at::_foreach_mul_(l.buffers, o.momentum());
      at::_foreach_add_(l.buffers, d_p, 1 - o.dampening());
    }
    d_p = o.nesterov() ? at::_foreach_add(d_p, l.buffers, o.momentum()) : l.buffers;
  }
  at::_foreach_add_(l.params, d_p, -o.lr());
}

void fused_step(SgdList& l, const torch::optim::SGDOptions& o, const at::Tensor* lr) {
  if (lr)
    compat::fused_sgd_(l.params, l.grads, l.buffers, o.weight_decay(), o.momentum(), *lr, o.dampening(), o.nesterov(),
                       l.first);
  else
    compat::fused_sgd_(l.params, l.grads, l.buffers, o.weight_decay(), o.momentum(), o.lr(), o.dampening(),
                       o.nesterov(), l.first);
}

}  // namespace

SGD::SGD(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::SGDOptions defaults, StepKernel kernel)
    : torch::optim::SGD(std::move(groups), defaults), kernel_(kernel) {}
SGD::SGD(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults, StepKernel kernel)
    : torch::optim::SGD(std::move(params), defaults), kernel_(kernel) {}

// Note [A momentum buffer is the first step's gradient]: torch::optim::SGD makes a
// parameter's buffer on its first step as a copy of the (decayed) gradient, and
// scales it from the next step on; the fused kernel does the same when told it is the
// first step. So the lists split on whether the buffer exists, and a new buffer is
// made here, empty, for the kernel to fill.
at::Tensor SGD::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  auto loss = run_closure(closure);
  for (std::size_t g = 0; g < param_groups().size(); ++g) {
    auto& group = param_groups()[g];
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    const auto params = params_with_grads(group, "SGD");
    auto has_buffer = [&](std::size_t i) -> std::int64_t {
      if (o.momentum() == 0) return 0;
      return state().count(compat::optimizer_state_key(params[i])) ? 1 : 0;
    };
    for (const auto& list : split_lists(params, has_buffer)) {
      SgdList l;
      l.params = pick(params, list);
      l.first = o.momentum() != 0 && list.extra == 0;
      for (const auto& p : l.params) {
        l.grads.push_back(p.grad());
        if (o.momentum() == 0) continue;
        auto& slot = state()[compat::optimizer_state_key(p)];
        if (!slot) {
          auto made = std::make_unique<torch::optim::SGDParamState>();
          made->momentum_buffer(at::empty_like(p, at::MemoryFormat::Preserve));
          slot = std::move(made);
        }
        l.buffers.push_back(static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer());
      }
      if (device_.on) {
        resolve(StepKernel::fused, list.device, list.dtype);  // throws, naming the fix, where there is none
        fused_step(l, o, &learning_rate_tensor(device_, g, "SGD"));
        continue;
      }
      switch (resolve(kernel_, list.device, list.dtype)) {
        case StepKernel::fused: fused_step(l, o, nullptr); break;
        case StepKernel::foreach: foreach_step(l, o); break;
        default: for_loop_step(l, o); break;
      }
    }
  }
  return loss;
}

SGD& SGD::capturable(bool on) {
  set_capturable(device_, on, kernel_, "SGD");
  return *this;
}

void SGD::load_learning_rates() { optim::load_learning_rates(*this, device_); }

}  // namespace cohort::optim
