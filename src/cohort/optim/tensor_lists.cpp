#include "cohort/optim/tensor_lists.h"

#include <ATen/core/grad_mode.h>

#include "cohort/errors.h"

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

}  // namespace cohort::optim
