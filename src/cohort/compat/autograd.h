#pragma once
// Note [Autograd node pointers]: LibTorch up to 2.11 hands out autograd's nodes
// (Variable::grad_fn(), impl::grad_accumulator(), Edge::function) as
// std::shared_ptr<Node>; 2.15 as c10::intrusive_ptr<Node>. cohort holds them as
// compat::NodePtr and makes its own nodes with compat::make_node, which follow
// whichever the installed LibTorch uses.
#include <memory>
#include <type_traits>
#include <utility>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

namespace cohort::compat {

using NodePtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

template <typename T, typename... Args>
auto make_node(Args&&... args) {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>)
    return std::make_shared<T>(std::forward<Args>(args)...);
  else
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
}

}  // namespace cohort::compat
