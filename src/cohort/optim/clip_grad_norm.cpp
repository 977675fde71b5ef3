#include "cohort/optim/clip_grad_norm.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <optional>
#include <unordered_map>

#include "cohort/errors.h"

namespace cohort::optim {

// Note [Which groups a norm sums over]
// The whole model's 2-norm is the square root of the sum, over its parameters, of
// each gradient's squared norm, every parameter counted once. Over a group whose
// ranks hold disjoint pieces of a gradient (a TP slice, fully_shard's chunk of a flat
// parameter, a pipeline stage's own layers) the pieces' squares add up to the
// whole's. Over a group whose ranks hold the same gradient whole (DDP replicas, whose
// gradients the reducer has already averaged; a TP group's LayerNorms and
// row-parallel biases) they must not be added: that would count it size() times. So
// each part's local sum of squares is all-reduced over the groups its GradPart names
// and no others, and each rank then adds up the parts. A part over two groups (a
// stage's TP slices: tp, then pp) is summed over one, then the other: over every rank
// of their product, each stage's slices once. The inf-norm is the same with max for
// sum.
//
// One all-reduce per distinct group (a Group's handles share one backend), of the
// vector of partial sums of the parts that name it, in the order the groups first
// appear in the parts. Every rank of a group then issues the same collectives in the
// same order, provided that every rank passes parts of the same shape; a rank that
// holds no gradient of a part sends its zero.

namespace {

constexpr double kEps = 1e-6;  // as torch::nn::utils::clip_grad_norm_

void check_norm_type(double norm_type, const char* where) {
  if (norm_type != 2.0 && !(std::isinf(norm_type) && norm_type > 0))
    throw ConfigError(fmt::format("cohort {}: norm_type {} is not supported; use 2 or "
                                  "std::numeric_limits<double>::infinity()",
                                  where, norm_type));
}

// The gradients of each part, each parameter once, all on one device.
struct Gathered {
  std::vector<std::vector<at::Tensor>> grads;  // per part
  at::Device device = at::kCPU;
};

Gathered gather_grads(const std::vector<GradPart>& parts, const char* where) {
  Gathered out;
  out.grads.resize(parts.size());
  std::unordered_map<const c10::TensorImpl*, std::size_t> owner;
  std::optional<at::Device> device, first_param_device;
  std::string device_of;  // which gradient fixed `device`, for the error
  for (std::size_t i = 0; i < parts.size(); ++i) {
    for (std::size_t k = 0; k < parts[i].parameters.size(); ++k) {
      const auto& p = parts[i].parameters[k];
      if (!p.defined())
        throw ConfigError(fmt::format("cohort {}: parameter {} of part {} is an undefined tensor; pass the "
                                      "model's parameters (module.parameters())",
                                      where, k, i));
      auto [it, fresh] = owner.emplace(p.unsafeGetTensorImpl(), i);
      if (!fresh) {
        if (it->second != i)
          throw ConfigError(fmt::format("cohort {}: parameter {} of part {} is in part {} too, so its norm would "
                                        "count twice; put each parameter in one part (a tied embedding in the "
                                        "part of one stage)",
                                        where, k, i, it->second));
        continue;
      }
      if (!first_param_device) first_param_device = p.device();
      const auto& g = p.grad();
      if (!g.defined()) continue;
      if (!device) {
        device = g.device();
        device_of = fmt::format("parameter {} of part {}", k, i);
      } else if (g.device() != *device) {
        throw ConfigError(fmt::format("cohort {}: the gradient of parameter {} of part {} is on {}, that of {} on "
                                      "{}; move the whole model (its local parts) to one device",
                                      where, k, i, g.device().str(), device_of, device->str()));
      }
      out.grads[i].push_back(g);
    }
  }
  // A rank without gradients still takes part in the collectives, on its parameters'
  // device (NCCL needs a CUDA tensor).
  out.device = device ? *device : first_param_device ? *first_param_device : at::Device(at::kCPU);
  return out;
}

// This rank's sum of squared norms of `grads` (inf: their largest norm), as a 0-dim
// double. One _foreach_norm per dtype, which LibTorch runs as one fused kernel on CUDA.
at::Tensor local_partial(const std::vector<at::Tensor>& grads, double norm_type, at::Device device) {
  const bool inf = std::isinf(norm_type);
  auto out = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& g : grads) by_dtype[g.scalar_type()].push_back(g);
  for (const auto& [dtype, list] : by_dtype) {
    auto norms = at::stack(at::_foreach_norm(list, norm_type)).to(at::kDouble);
    out = inf ? at::maximum(out, norms.max()) : out + norms.square().sum();
  }
  return out;
}

// total_grad_norm; `where` names the function the user called, in errors.
at::Tensor total_norm(const std::vector<GradPart>& parts, double norm_type, const char* where) {
  check_norm_type(norm_type, where);
  const bool inf = std::isinf(norm_type);
  at::NoGradGuard no_grad;
  auto gathered = gather_grads(parts, where);

  // Distinct groups in order of first appearance, each with the parts that name it.
  std::vector<comm::Group> groups;
  std::vector<std::vector<std::size_t>> named_by;
  std::vector<const void*> ids;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (!parts[i].counted) continue;
    for (const auto& g : parts[i].sum_over) {
      if (!g.is_member())
        throw ConfigError(fmt::format("cohort {}: part {} names a group this rank is not a member of; name the "
                                      "groups of this rank (its DeviceMesh's, or its World::new_group's)",
                                      where, i));
      if (g.size() == 1) continue;  // a sum over this rank alone
      const void* id = &g.backend();
      std::size_t j = 0;
      while (j < ids.size() && ids[j] != id) ++j;
      if (j == ids.size()) {
        ids.push_back(id);
        groups.push_back(g);
        named_by.emplace_back();
      }
      if (named_by[j].empty() || named_by[j].back() != i) named_by[j].push_back(i);
    }
  }

  if (parts.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kDouble));
  std::vector<at::Tensor> partials;
  for (std::size_t i = 0; i < parts.size(); ++i)
    partials.push_back(local_partial(parts[i].counted ? gathered.grads[i] : std::vector<at::Tensor>{}, norm_type,
                                     gathered.device));
  const auto op = inf ? comm::ReduceOp::kMax : comm::ReduceOp::kSum;
  for (std::size_t j = 0; j < groups.size(); ++j) {
    // Stacked and read back on the device: an index tensor made on the host would cost
    // a copy to the device, which waits for it.
    std::vector<at::Tensor> named;
    for (const auto i : named_by[j]) named.push_back(partials[i]);
    auto some = at::stack(named);
    groups[j].all_reduce(some, op);
    for (std::size_t k = 0; k < named_by[j].size(); ++k) partials[named_by[j][k]] = some[k];
  }
  auto per_part = at::stack(partials);
  return inf ? per_part.max() : per_part.sum().sqrt();
}

}  // namespace

at::Tensor total_grad_norm(const std::vector<GradPart>& parts, double norm_type) {
  return total_norm(parts, norm_type, "total_grad_norm");
}

at::Tensor clip_grad_norm_(const std::vector<GradPart>& parts, ClipGradNormOptions options) {
  const char* where = "clip_grad_norm_";
  if (!(options.max_norm() > 0))
    throw ConfigError(fmt::format("cohort {}: max_norm is {}; give a positive bound on the gradients' norm "
                                  "(ClipGradNormOptions(1.0))",
                                  where, options.max_norm()));
  auto total = total_norm(parts, options.norm_type(), where);
  if (options.error_if_nonfinite() && !total.isfinite().item<bool>())
    throw Error(fmt::format("cohort {}: the total {}-norm of the gradients is {}; the gradients were left as "
                            "they are. Skip this step (GradScaler does), or lower the learning rate",
                            where, options.norm_type(), total.item<double>()));
  at::NoGradGuard no_grad;
  // As clip_grad_norm_ with foreach=False: the coefficient stays on the device. LibTorch
  // 1.13 has no _foreach_mul_(TensorList, Tensor), and its list overload does not
  // broadcast on the fast path, so one mul_ per gradient.
  const auto coefficient = (options.max_norm() / (total + kEps)).clamp_max(1.0);
  std::map<at::ScalarType, at::Tensor> in_dtype;
  std::unordered_map<const c10::TensorImpl*, bool> done;
  for (const auto& part : parts)
    for (const auto& p : part.parameters) {
      const auto& g = p.grad();
      if (!g.defined() || !done.emplace(p.unsafeGetTensorImpl(), true).second) continue;
      auto& c = in_dtype[g.scalar_type()];
      if (!c.defined()) c = coefficient.to(g.scalar_type());
      g.mul_(c);
    }
  return total;
}

}  // namespace cohort::optim
