#include "cohort/ddp/autograd_graph.h"

#include <torch/csrc/autograd/variable.h>

#include <cstring>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

namespace cohort::ddp {

namespace {

// torch::autograd::Function<T>'s node is CppNode<T>; its mangled name (Itanium ABI,
// as LibTorch's on Linux) names the template, whatever T is.
bool is_custom_function(const torch::autograd::Node& node) {
  return std::strstr(typeid(node).name(), "8autograd7CppNodeI") != nullptr;
}

}  // namespace

Reachability reachable_accumulators(const std::vector<at::Tensor>& outputs,
                                    const std::vector<compat::NodePtr>& accumulators) {
  using torch::autograd::Node;
  std::unordered_map<const Node*, std::size_t> index;
  for (std::size_t i = 0; i < accumulators.size(); ++i) index.emplace(accumulators[i].get(), i);

  Reachability result;
  auto& used = result.used;
  used.assign(accumulators.size(), false);
  std::unordered_set<const Node*> seen;
  std::vector<Node*> stack;
  auto visit = [&](Node* node) {
    if (node && seen.insert(node).second) stack.push_back(node);
  };
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    // A parameter returned as is has no grad_fn: its accumulator is the root.
    auto root = out.grad_fn() ? out.grad_fn() : torch::autograd::impl::try_get_grad_accumulator(out);
    visit(root.get());
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    auto hit = index.find(node);
    if (hit != index.end()) used[hit->second] = true;
    else if (!result.through_custom_function && is_custom_function(*node)) result.through_custom_function = true;
    for (const auto& edge : node->next_edges()) visit(edge.function.get());
  }
  return result;
}

}  // namespace cohort::ddp
