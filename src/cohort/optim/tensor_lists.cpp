#include "cohort/optim/tensor_lists.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/version.h>

#include "cohort/compat/fused_optimizer.h"
#include "cohort/errors.h"
#include "cohort/optim/capturable.h"

namespace cohort::optim {

std::vector<at::Tensor> params_with_grads(const torch::optim::OptimizerParamGroup& group, const std::string& who) {
  std::vector<at::Tensor> out;
  std::size_t index = 0;
  for (const auto& p : group.params()) {
    const auto& g = p.grad();
    if (g.defined()) {
      const std::string where = "cohort " + who + ": parameter " + std::to_string(index) + " of its group";
      if (g.is_sparse())
        throw ConfigError(where + " has a sparse gradient, which " + who +
                          " does not take; fix: use dense gradients (torch::nn::Embedding without sparse(true))");
      if (g.device() != p.device() || g.scalar_type() != p.scalar_type())
        throw ConfigError(where + " is " + c10::toString(p.scalar_type()) + " on " + p.device().str() +
                          " but its gradient is " + c10::toString(g.scalar_type()) + " on " + g.device().str() +
                          "; fix: keep each gradient with its parameter (move the model before making the optimizer)");
      out.push_back(p);
    }
    ++index;
  }
  return out;
}

std::vector<TensorList> split_lists(const std::vector<at::Tensor>& tensors,
                                    const std::function<std::int64_t(std::size_t)>& extra) {
  std::vector<TensorList> lists;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto device = tensors[i].device();
    const auto dtype = tensors[i].scalar_type();
    const auto e = extra(i);
    TensorList* into = nullptr;
    for (auto& l : lists)
      if (l.device == device && l.dtype == dtype && l.extra == e) into = &l;
    if (!into) into = &lists.emplace_back(TensorList{device, dtype, e, {}});
    into->members.push_back(i);
  }
  return lists;
}

std::vector<at::Tensor> pick(const std::vector<at::Tensor>& all, const TensorList& list) {
  std::vector<at::Tensor> out;
  out.reserve(list.members.size());
  for (auto i : list.members) out.push_back(all[i]);
  return out;
}

at::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

void require_capturable(StepKernel wanted, const std::string& who) {
  if (!compat::kHasFusedOptimizers)
    throw ConfigError("cohort " + who + ": capturable(true) needs the fused kernels, which take the learning rate and "
                      "step counts as device tensors, and LibTorch " + TORCH_VERSION +
                      " has none (LibTorch 2.4 or newer has them); fix: drop capturable (and CUDA graphs)");
  if (wanted == StepKernel::for_loop || wanted == StepKernel::foreach)
    throw ConfigError("cohort " + who + ": capturable(true) runs the fused kernel only, but the step kernel is " +
                      to_string(wanted) + "; fix: use StepKernel::fused or StepKernel::automatic");
}

void set_capturable(DeviceStepState& state, bool on, StepKernel wanted, const std::string& who) {
  if (on) require_capturable(wanted, who);
  state = DeviceStepState{on};
}

void load_learning_rates(torch::optim::Optimizer& optimizer, DeviceStepState& state) {
  auto& groups = optimizer.param_groups();
  state.lrs.resize(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].params().empty()) continue;
    const double lr = groups[g].options().get_lr();
    auto& t = state.lrs[g];
    if (!t.defined())
      t = at::full({}, lr, groups[g].params().front().options().dtype(at::kFloat).requires_grad(false));
    else
      t.fill_(lr);
  }
}

const at::Tensor& learning_rate_tensor(const DeviceStepState& state, std::size_t index, const std::string& who) {
  if (index >= state.lrs.size() || !state.lrs[index].defined())
    throw ConfigError("cohort " + who + ": a capturable optimizer reads the learning rate from the device; call "
                      "load_learning_rates() before every step (Note [A step inside a CUDA graph])");
  return state.lrs[index];
}

std::vector<at::Tensor> advance_device_steps(DeviceStepState& state, const std::vector<at::Tensor>& params,
                                             const std::vector<std::int64_t>& host_counts) {
  std::vector<at::Tensor> out;
  out.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto& t = state.steps[params[i].unsafeGetTensorImpl()];
    if (!t.defined())
      t = at::full({}, static_cast<double>(host_counts[i]), params[i].options().dtype(at::kFloat).requires_grad(false));
    out.push_back(t);
  }
  at::_foreach_add_(out, 1);
  return out;
}

}  // namespace cohort::optim
