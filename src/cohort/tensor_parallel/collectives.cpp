#include "cohort/tensor_parallel/collectives.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>
#include <vector>

#include "cohort/errors.h"

namespace cohort::tensor_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Note [Conjugate collectives]
// A TP rank computes a piece of the model; the loss is the same on every rank (the
// activations are made whole again before it). If forward hands every rank the same
// x (copy_to_tp), each rank's piece contributes its own part of dL/dx, so backward
// must sum them: an all-reduce. If forward sums the ranks' partial outputs
// (reduce_from_tp), every rank receives the whole dL/dy, which is each partial
// output's gradient as it is: backward is the identity. Gathering along a dimension
// hands every rank the whole tensor, and only this rank's chunk came from it, so
// backward keeps that chunk of the gradient; scattering is the reverse. A
// reduce-scatter's backward is an all-gather and the reverse, for the same reasons as
// the first pair. Every backward is itself a collective or its absence, so all ranks
// run the same backward graph in the same order, as they run the same forward.

// Carries the group from forward to backward in saved_data, which holds IValues.
struct GroupCapsule : torch::CustomClassHolder {
  GroupCapsule(comm::Group g, std::int64_t d) : group(std::move(g)), dim(d) {}
  comm::Group group;
  std::int64_t dim;
};

void save(AutogradContext* ctx, comm::Group group, std::int64_t dim = 0) {
  ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(std::move(group), dim));
}

GroupCapsule& saved(AutogradContext* ctx) {
  auto capsule = ctx->saved_data["group"].toCapsule();
  return *static_cast<GroupCapsule*>(capsule.get());
}

std::int64_t checked_dim(const at::Tensor& x, const comm::Group& group, std::int64_t dim, const char* op) {
  const auto rank = x.dim();
  if (rank == 0 || dim < -rank || dim >= rank)
    throw ConfigError(fmt::format("cohort tensor_parallel::{}: dimension {} is out of range for a tensor of shape [{}] "
                                  "(rank {} of TP group '{}')",
                                  op, dim, fmt::join(x.sizes(), ", "), group.rank(), group.name()));
  return dim < 0 ? dim + rank : dim;
}

void check_divides(const at::Tensor& x, const comm::Group& group, std::int64_t dim, const char* op) {
  if (x.size(dim) % group.size() == 0) return;
  throw ConfigError(fmt::format("cohort tensor_parallel::{}: dimension {} of a tensor of shape [{}] is {}, which the "
                                "{} ranks of TP group '{}' cannot split evenly (rank {}); make it a multiple of the "
                                "TP size",
                                op, dim, fmt::join(x.sizes(), ", "), x.size(dim), group.size(), group.name(),
                                group.rank()));
}

// Note [Autocast activations over Gloo]
// Under bf16 autocast on the CPU the activations a TP collective carries are
// bfloat16, which LibTorch 1.13's Gloo can neither sum nor gather ("Invalid scalar
// type"; Note [bfloat16 over Gloo] in ddp/comm_hook.cpp). Over Gloo they travel as
// float32 and come back in their own dtype: exact for a gather, and for a sum one
// rounding at the end instead of one per addition. NCCL takes them as they are.
at::Tensor widened(const at::Tensor& x, const comm::Group& group) {
  const bool narrow = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  return narrow && group.backend_name() == "gloo" ? x.to(at::kFloat) : x;
}

at::Tensor all_reduced(const at::Tensor& x, comm::Group& group) {
  auto out = widened(x, group).clone(at::MemoryFormat::Contiguous);
  group.all_reduce(out, comm::ReduceOp::kSum);
  return out.to(x.scalar_type());
}

at::Tensor gathered(const at::Tensor& x, comm::Group& group, std::int64_t dim) {
  auto parts = group.all_gather(widened(x, group).contiguous());
  return at::cat(parts, dim).to(x.scalar_type());
}

at::Tensor chunk_of(const at::Tensor& x, const comm::Group& group, std::int64_t dim) {
  return x.chunk(group.size(), dim)[static_cast<std::size_t>(group.rank())].contiguous();
}

// The sum over ranks of chunk rank() along `dim`: the group reduce-scatters along the
// first dimension, so `dim` travels there and back.
at::Tensor reduce_scattered(const at::Tensor& x, comm::Group& group, std::int64_t dim) {
  auto front = widened(x, group).movedim(dim, 0).contiguous();
  return group.reduce_scatter(front, comm::ReduceOp::kSum).movedim(0, dim).contiguous().to(x.scalar_type());
}

class CopyToTp : public torch::autograd::Function<CopyToTp> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group group) {
    save(ctx, std::move(group));
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduced(grads[0], saved(ctx).group), at::Tensor()};
  }
};

class ReduceFromTp : public torch::autograd::Function<ReduceFromTp> {
 public:
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, comm::Group group) {
    return all_reduced(x, group);
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

class GatherFromTp : public torch::autograd::Function<GatherFromTp> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group group, std::int64_t dim) {
    auto out = gathered(x, group, dim);
    save(ctx, std::move(group), dim);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto& s = saved(ctx);
    return {chunk_of(grads[0], s.group, s.dim), at::Tensor(), at::Tensor()};
  }
};

class ScatterToTp : public torch::autograd::Function<ScatterToTp> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group group, std::int64_t dim) {
    auto out = chunk_of(x, group, dim);
    save(ctx, std::move(group), dim);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto& s = saved(ctx);
    return {gathered(grads[0], s.group, s.dim), at::Tensor(), at::Tensor()};
  }
};

class ReduceScatterToTp : public torch::autograd::Function<ReduceScatterToTp> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group group, std::int64_t dim) {
    auto out = reduce_scattered(x, group, dim);
    save(ctx, std::move(group), dim);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto& s = saved(ctx);
    return {gathered(grads[0], s.group, s.dim), at::Tensor(), at::Tensor()};
  }
};

class AllGatherFromTp : public torch::autograd::Function<AllGatherFromTp> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group group, std::int64_t dim) {
    auto out = gathered(x, group, dim);
    save(ctx, std::move(group), dim);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto& s = saved(ctx);
    return {reduce_scattered(grads[0], s.group, s.dim), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_tp(const at::Tensor& x, comm::Group group) {
  if (group.size() == 1) return x;
  return CopyToTp::apply(x, std::move(group));
}

at::Tensor reduce_from_tp(const at::Tensor& x, comm::Group group) {
  if (group.size() == 1) return x;
  return ReduceFromTp::apply(x, std::move(group));
}

at::Tensor gather_from_tp(const at::Tensor& x, comm::Group group, std::int64_t dim) {
  dim = checked_dim(x, group, dim, "gather_from_tp");
  if (group.size() == 1) return x;
  return GatherFromTp::apply(x, std::move(group), dim);
}

at::Tensor scatter_to_tp(const at::Tensor& x, comm::Group group, std::int64_t dim) {
  dim = checked_dim(x, group, dim, "scatter_to_tp");
  check_divides(x, group, dim, "scatter_to_tp");
  if (group.size() == 1) return x;
  return ScatterToTp::apply(x, std::move(group), dim);
}

at::Tensor reduce_scatter_to_tp(const at::Tensor& x, comm::Group group, std::int64_t dim) {
  dim = checked_dim(x, group, dim, "reduce_scatter_to_tp");
  check_divides(x, group, dim, "reduce_scatter_to_tp");
  if (group.size() == 1) return x;
  return ReduceScatterToTp::apply(x, std::move(group), dim);
}

at::Tensor all_gather_from_tp(const at::Tensor& x, comm::Group group, std::int64_t dim) {
  dim = checked_dim(x, group, dim, "all_gather_from_tp");
  if (group.size() == 1) return x;
  return AllGatherFromTp::apply(x, std::move(group), dim);
}

}  // namespace cohort::tensor_parallel
