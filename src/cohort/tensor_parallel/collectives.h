#pragma once
// The differentiable collectives of tensor parallelism, over the TP group (the
// innermost dimension of the device mesh). Each is a forward collective paired with
// the backward that makes every rank's gradients those of the whole model's loss
// (Note [Conjugate collectives] in collectives.cpp):
//
//   function                      forward                    backward
//   copy_to_tp(x, g)              x                          all-reduce(dx)
//   reduce_from_tp(x, g)          all-reduce(x)              dx
//   gather_from_tp(x, g, d)       all-gather along d         this rank's chunk of dx along d
//   scatter_to_tp(x, g, d)        this rank's chunk along d  all-gather of dx along d
//   reduce_scatter_to_tp(x, g, d) reduce-scatter along d     all-gather of dx along d
//   all_gather_from_tp(x, g, d)   all-gather along d         reduce-scatter of dx along d
//
// Megatron-LM calls the first two f and g: a column-parallel layer starts with
// copy_to_tp, a row-parallel one ends with reduce_from_tp. With sequence parallelism
// the last two replace them, the activations between blocks being sharded along the
// sequence. A dimension split over the group must divide by its size; otherwise a
// ConfigError names the tensor's shape, the dimension and the group.
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "cohort/comm/group.h"

namespace cohort::tensor_parallel {

at::Tensor copy_to_tp(const at::Tensor& x, comm::Group group);
at::Tensor reduce_from_tp(const at::Tensor& x, comm::Group group);
at::Tensor gather_from_tp(const at::Tensor& x, comm::Group group, std::int64_t dim);
at::Tensor scatter_to_tp(const at::Tensor& x, comm::Group group, std::int64_t dim);
at::Tensor reduce_scatter_to_tp(const at::Tensor& x, comm::Group group, std::int64_t dim);
at::Tensor all_gather_from_tp(const at::Tensor& x, comm::Group group, std::int64_t dim);

}  // namespace cohort::tensor_parallel
