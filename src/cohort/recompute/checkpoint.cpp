#include "cohort/recompute/checkpoint.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <unordered_set>
#include <ATen/autocast_mode.h>

#include "cohort/checkpoint/rng_state.h"
#include "cohort/amp/autocast_state.h"
#include "cohort/errors.h"

namespace cohort::recompute {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The buffers of `modules`, copied so they can be put back.
std::vector<std::pair<at::Tensor, at::Tensor>> snapshot_buffers(
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (const auto& m : modules)
    for (auto& b : m->buffers())
      if (b.defined()) out.emplace_back(b, b.clone());
  return out;
}

// With .modules(), only the inputs and the modules' parameters get gradients from
// the segment. A tensor the function closes over (another module's parameter, a
// free tensor requiring grad) would silently get none: find such leaves in the
// recomputed graph and refuse.
void check_leaves(const TensorList& roots, const TensorList& known) {
  std::unordered_set<const torch::autograd::Node*> stop;  // where the known tensors' gradients enter
  for (const auto& t : known)
    if (t.defined() && t.requires_grad()) stop.insert(torch::autograd::impl::gradient_edge(t).function.get());
  std::vector<torch::autograd::Node*> todo;
  std::unordered_set<torch::autograd::Node*> seen;
  for (const auto& r : roots)
    if (r.grad_fn()) todo.push_back(r.grad_fn().get());
  while (!todo.empty()) {
    auto* node = todo.back();
    todo.pop_back();
    for (const auto& edge : node->next_edges()) {
      auto* next = edge.function.get();
      if (!next || stop.count(next) || !seen.insert(next).second) continue;
      if (auto* leaf = dynamic_cast<torch::autograd::AccumulateGrad*>(next)) {
        throw ConfigError(fmt::format(
            "cohort checkpoint: the checkpointed function uses a tensor of shape {} that requires a gradient but is "
            "neither one of its inputs nor a parameter of the modules given to .modules(); it would get no "
            "gradient. Pass it as an input, or add the module that owns it to .modules()",
            c10::str(leaf->variable.sizes())));
      }
      todo.push_back(next);
    }
  }
}

struct Segment : torch::CustomClassHolder {
  SegmentFn fn;
  CheckpointOptions options;
  std::size_t inputs = 0;  // the first `inputs` tensors are fn's inputs, the rest parameters
  std::vector<bool> input_requires_grad;
  c10::Device device = c10::kCPU;  // whose generator is kept besides the CPU's
  std::vector<at::Tensor> rng;
  amp::AutocastState autocast;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<Segment> segment, at::TensorList all) {
    // autograd::Function runs this with gradients off: nothing inside is kept.
    TensorList inputs(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(segment->inputs));
    if (segment->options.preserve_rng_state()) segment->rng = checkpoint::capture_rng_state(segment->device);
    segment->autocast = amp::AutocastState::capture();
    ctx->save_for_backward(inputs);
    ctx->saved_data["segment"] = c10::IValue::make_capsule(segment);
    auto outputs = segment->fn(inputs);
    for (std::size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i].defined() && !outputs[i].is_floating_point() && !outputs[i].is_complex())
        throw ConfigError(fmt::format("cohort checkpoint: output {} of the checkpointed function has dtype {}; a "
                                      "checkpointed segment returns floating-point tensors only",
                                      i, c10::toString(outputs[i].scalar_type())));
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto segment = c10::static_intrusive_pointer_cast<Segment>(ctx->saved_data["segment"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    TensorList inputs;
    for (std::size_t i = 0; i < saved.size(); ++i) {
      auto d = saved[i].defined() ? saved[i].detach() : at::Tensor();
      if (d.defined()) d.requires_grad_(segment->input_requires_grad[i]);
      inputs.push_back(d);
    }
    // Note [Recomputing exactly]
    TensorList outputs;
    // Put back after differentiating: BatchNorm's backward saved its running
    // statistics, and restoring them in place before would bump their version.
    const auto buffers = snapshot_buffers(segment->options.modules());
    {
      const bool rng = segment->options.preserve_rng_state();
      const auto now = rng ? checkpoint::capture_rng_state(segment->device) : std::vector<at::Tensor>();
      const auto autocast_now = amp::AutocastState::capture();
      if (rng) checkpoint::restore_rng_state(segment->device, segment->rng);
      // As a guard would: one more nesting level while recomputing, and the cast
      // cache dropped when it ends at the outermost level; else the recomputation's
      // casts of the weights would outlive this step and serve the next one the
      // weights from before the optimizer's update.
      segment->autocast.apply();
      at::autocast::increment_nesting();
      auto leave = [&] {
        if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
        autocast_now.apply();
      };
      try {
        at::AutoGradMode grad_on(true);
        outputs = segment->fn(inputs);
      } catch (...) {
        leave();
        throw;
      }
      leave();
      if (rng) checkpoint::restore_rng_state(segment->device, now);
    }
    auto restore_buffers = [&buffers] {
      at::NoGradGuard no_grad;
      for (const auto& [buffer, copy] : buffers) buffer.copy_(copy);
    };
    TensorList roots, grads;
    for (std::size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (!outputs[i].defined() || !outputs[i].requires_grad() || !grad_outputs[i].defined()) continue;
      roots.push_back(outputs[i]);
      grads.push_back(grad_outputs[i]);
    }
    variable_list result{at::Tensor()};  // the segment argument has no gradient
    // Inputs then parameters, as forward's `all` (Note [Parameters as inputs]).
    TensorList wanted, all = inputs;
    for (const auto& m : segment->options.modules())
      for (const auto& p : m->parameters()) all.push_back(p);
    for (const auto& t : all)
      if (t.defined() && t.requires_grad()) wanted.push_back(t);
    if (segment->options.modules().empty()) {
      // No parameters as inputs: differentiate into their .grad here (reentrant),
      // which is only right under backward(): autograd::grad() must not fill .grad.
      if (!torch::autograd::Engine::get_default_engine().is_checkpoint_valid())
        throw ConfigError(
            "cohort checkpoint: a segment checkpointed without .modules() differentiates into the parameters' "
            ".grad, so it works with backward() but not with autograd::grad(); pass the modules it runs "
            "(CheckpointOptions().modules(...)) to use grad()");
      if (!roots.empty()) torch::autograd::backward(roots, grads);
      restore_buffers();
      for (const auto& in : inputs) result.push_back(in.defined() && in.requires_grad() ? in.grad() : at::Tensor());
      return result;
    }
    check_leaves(roots, all);
    variable_list got;
    if (!roots.empty() && !wanted.empty())
      got = torch::autograd::grad(roots, wanted, grads, /*retain_graph=*/false, /*create_graph=*/false,
                                  /*allow_unused=*/true);
    restore_buffers();
    std::size_t k = 0;
    for (const auto& t : all)
      result.push_back(t.defined() && t.requires_grad() && !got.empty() ? got[k++] : at::Tensor());
    return result;
  }
};

bool any_requires_grad(const TensorList& tensors) {
  for (const auto& t : tensors)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

}  // namespace

TensorList checkpoint(SegmentFn fn, const TensorList& inputs, CheckpointOptions options) {
  TensorList all = inputs;
  for (const auto& m : options.modules())
    for (const auto& p : m->named_parameters()) {
      // A fully sharded unit's parameters are empty outside it (Note [Freeing in
      // place] in zero/flat_parameter.h); as inputs here they would fix that shape.
      if (p.value().defined() && p.value().requires_grad() && p.value().numel() == 0)
        throw ConfigError(fmt::format(
            "cohort checkpoint: parameter '{}' of a module given to .modules() is empty. Under "
            "cohort::zero::fully_shard a unit's parameters exist only while the unit runs: checkpoint a segment "
            "made of fully sharded units without .modules(), or checkpoint inside the unit's own forward",
            p.key()));
      all.push_back(p.value());
    }
  if (!at::GradMode::is_enabled() || !any_requires_grad(all)) return fn(inputs);
  auto segment = c10::make_intrusive<Segment>();
  segment->fn = std::move(fn);
  segment->options = std::move(options);
  segment->inputs = inputs.size();
  for (const auto& t : inputs) {
    segment->input_requires_grad.push_back(t.defined() && t.requires_grad());
    if (t.defined() && t.is_cuda()) segment->device = t.device();
  }
  return CheckpointFunction::apply(segment, at::TensorList(all));
}

at::Tensor checkpoint_sequential(const torch::nn::Sequential& model, int segments, const at::Tensor& input,
                                 CheckpointOptions options) {
  const int n = static_cast<int>(model->size());
  if (segments < 1 || segments > n)
    throw ConfigError(fmt::format("cohort checkpoint_sequential: {} segments for a Sequential of {} modules; use "
                                  "between 1 and {}",
                                  segments, n, n));
  auto children = model->children();
  auto x = input;
  // PyTorch's cut: segments of n / segments modules, the last taking the rest.
  const int size = n / segments;
  for (int s = 0; s < segments; ++s) {
    const int begin = s * size, end = s + 1 == segments ? n : (s + 1) * size;
    std::vector<std::shared_ptr<torch::nn::Module>> part(children.begin() + begin, children.begin() + end);
    // The holder is copied: backward calls this after the caller's scope may be gone.
    torch::nn::Sequential seq = model;
    auto run = [seq, begin, end](const TensorList& in) mutable {
      auto h = in.at(0);
      for (auto it = seq->begin() + begin; it != seq->begin() + end; ++it) h = it->forward(h);
      return TensorList{h};
    };
    if (s + 1 == segments) {
      x = run({x})[0];
    } else {
      auto o = options;
      o.modules(part);
      x = checkpoint(run, {x}, o)[0];
    }
  }
  return x;
}

}  // namespace cohort::recompute
