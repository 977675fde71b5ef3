// Pipeline's actions within a step: transfers, forward, backward (whole or split,
// with recomputation) of one micro-batch on one stage, and where() for their errors.
#include "cohort/pipeline/pipeline.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>

#include "cohort/checkpoint/rng_state.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "cohort/pipeline/pipeline_internal.h"
#include "cohort/pipeline/wire.h"

namespace cohort::pipeline {

namespace {

// A stage's inputs as leaves of its own graph: the gradient stops here and is sent
// back (or handed to the local previous stage) by the runtime.
TensorList as_stage_inputs(const TensorList& tensors) {
  TensorList out;
  for (const auto& t : tensors) {
    if (!t.defined()) {
      out.emplace_back();
      continue;
    }
    auto d = t.detach();
    if (d.is_floating_point() || d.is_complex()) d.requires_grad_(true);
    out.push_back(d);
  }
  return out;
}

const char* action_name(ActionKind k) {
  switch (k) {
    case ActionKind::kForward: return "forward";
    case ActionKind::kBackward: return "backward";
    case ActionKind::kBackwardInput: return "backward (inputs)";
    case ActionKind::kBackwardWeight: return "backward (weights)";
    default: return "transfer";
  }
}

}  // namespace

void Pipeline::run_action(Run& run, const Action& action) {
  const int s = action.stage;
  const int m = action.microbatch;
  auto peer_of = [&](int stage) { return schedule_.rank_of(stage); };
  try {
    switch (action.kind) {
      case ActionKind::kRecvActivation:
        run.slots[{s, m}].inputs = as_stage_inputs(
            recv_tensors(group_, peer_of(s - 1), Direction::kActivation, s, m, options_.device()));
        break;
      case ActionKind::kSendActivation:
        run.sends.push_back(send_tensors(group_, run.slots.at({s, m}).outputs, peer_of(s + 1), Direction::kActivation,
                                         s + 1, m, options_.device()));
        break;
      case ActionKind::kRecvGradient:
        run.slots[{s, m}].output_grads =
            recv_tensors(group_, peer_of(s + 1), Direction::kGradient, s, m, options_.device());
        break;
      case ActionKind::kSendGradient: {
        auto& slot = run.slots.at({s, m});
        run.sends.push_back(send_tensors(group_, slot.input_grads, peer_of(s - 1), Direction::kGradient, s - 1, m,
                                         options_.device()));
        slot.input_grads.clear();
        break;
      }
      case ActionKind::kForward: {
        const auto t0 = Clock::now();
        forward_action(run, s, m);
        run.compute += std::chrono::duration<double>(Clock::now() - t0).count();
        break;
      }
      default: {
        const auto t0 = Clock::now();
        backward_action(run, action.kind, s, m);
        run.compute += std::chrono::duration<double>(Clock::now() - t0).count();
        break;
      }
    }
  } catch (const TimeoutError& e) {
    throw TimeoutError(fmt::format("{} did not answer within the timeout; it is stuck or far behind (its output, or "
                                   "a stack dump of it, says where). {}",
                                   where(action), e.what()),
                       e.operation(), e.missing_ranks());
  } catch (const CommError& e) {
    throw CommError(fmt::format("{} failed; that stage most likely died (its output names why). {}", where(action),
                                e.what()));
  } catch (const c10::Error& e) {
    // The stage's own code (its forward, the loss, autograd) failed: say which.
    throw Error(fmt::format("{} failed: {}", where(action), e.what_without_backtrace()));
  } catch (const Error&) {
    throw;  // cohort's own refusals name their place already
  } catch (const std::exception& e) {
    throw Error(fmt::format("{} failed: {}", where(action), e.what()));
  } catch (...) {
    throw Error(fmt::format("{} failed: the stage's code (its forward or the loss) threw an exception that is not a "
                            "std::exception, so it carries no message",
                            where(action)));
  }
}

// "cohort pipeline: pipeline rank 0 (global rank 2), stage 0, at RG3@s0 (micro-batch
// 3's gradients from stage 1 on global rank 3)".
std::string Pipeline::where(const Action& action) const {
  const int s = action.stage;
  std::string peer;
  switch (action.kind) {
    case ActionKind::kRecvActivation: peer = "activations from stage {} on global rank {}"; break;
    case ActionKind::kSendActivation: peer = "activations to stage {} on global rank {}"; break;
    case ActionKind::kRecvGradient: peer = "gradients from stage {} on global rank {}"; break;
    case ActionKind::kSendGradient: peer = "gradients to stage {} on global rank {}"; break;
    default: break;
  }
  std::string detail;
  if (!peer.empty()) {
    const bool forward = action.kind == ActionKind::kRecvActivation || action.kind == ActionKind::kSendGradient;
    const int other = forward ? s - 1 : s + 1;
    detail = fmt::format(" (micro-batch {}'s {})", action.microbatch,
                         fmt::format(fmt::runtime(peer), other, group_.global_ranks()[schedule_.rank_of(other)]));
  } else {
    const bool loss = action.kind == ActionKind::kForward && s == schedule_.stages() - 1;
    detail = fmt::format(" ({} of micro-batch {})", loss ? "forward and loss" : action_name(action.kind),
                         action.microbatch);
  }
  return fmt::format("cohort pipeline: pipeline rank {} (global rank {}), stage {}, at {}{}", rank_,
                     group_.global_ranks()[rank_], s, to_string(action), detail);
}

void Pipeline::forward_action(Run& run, int s, int m) {
  auto& slot = run.slots[{s, m}];
  const int c = local_index(s);
  const bool last = s == schedule_.stages() - 1;
  if (s == 0) {
    slot.inputs = run.inputs->at(m);
  } else if (schedule_.rank_of(s - 1) == rank_) {
    slot.inputs = as_stage_inputs(run.slots.at({s - 1, m}).outputs);
  }
  if (!ddp_.empty() && ddp_[c] && !run.started[c]) {
    // Note [Pipeline stages under DDP]: DDP's forward bookkeeping runs once per
    // step, before the stage's first forward; until the stage's last backward its
    // hooks only accumulate (no_sync), and that backward is armed to reduce.
    ddp_[c]->before_forward(slot.inputs);
    if (schedule_.microbatches > 1) {
      auto no_sync = ddp_[c]->no_sync();
      ddp_[c]->after_forward({});
    }
  }
  run.started[c] = true;
  const auto& stage = stages_[c];
  auto mixed = autocast();
  if (options_.recompute()) {
    slot.rng = checkpoint::capture_rng_state(options_.device());
    at::NoGradGuard no_grad;
    slot.outputs = stage.forward(slot.inputs);
  } else {
    slot.outputs = stage.forward(slot.inputs);
  }
  if (last) {
    auto loss = options_.loss()(slot.outputs, run.targets->empty() ? TensorList{} : run.targets->at(m));
    run.losses[m] = loss.detach().item<double>();
    if (!options_.recompute()) slot.loss = loss * (run.weights[m] * run.loss_scale);
  }
  slot.live = true;
  run.peak = std::max(run.peak, ++run.live);
}

void Pipeline::backward_action(Run& run, ActionKind kind, int s, int m) {
  auto& slot = run.slots.at({s, m});
  const int c = local_index(s);
  const bool last = s == schedule_.stages() - 1;
  if (kind != ActionKind::kBackwardWeight) {
    if (options_.recompute()) {
      // Recompute the forward with the generators as they were, then put them back.
      auto now = checkpoint::capture_rng_state(options_.device());
      checkpoint::restore_rng_state(options_.device(), slot.rng);
      {
        // Note [Recomputing buffers]: the forward pass already updated the stage's
        // buffers (BatchNorm's running statistics) once; the recomputation must not
        // again, so what it changes is put back. The write goes through
        // variable_data() (a fresh version counter): the recomputed graph saved
        // those buffers (batch_norm's backward takes them), and a write it could see
        // would fail its version check in backward.
        auto buffers = stages_[c].module()->buffers();
        std::vector<at::Tensor> before;
        {
          at::NoGradGuard no_grad;
          for (const auto& b : buffers) before.push_back(b.defined() ? b.clone() : at::Tensor());
        }
        auto mixed = autocast();
        slot.outputs = stages_[c].forward(slot.inputs);
        {
          at::NoGradGuard no_grad;
          for (std::size_t i = 0; i < buffers.size(); ++i)
            if (before[i].defined() && !at::equal(buffers[i], before[i]))
              buffers[i].variable_data().copy_(before[i]);
        }
        if (last)
          slot.loss = options_.loss()(slot.outputs, run.targets->empty() ? TensorList{} : run.targets->at(m)) *
                      (run.weights[m] * run.loss_scale);
      }
      checkpoint::restore_rng_state(options_.device(), now);
    }
    if (!last && schedule_.rank_of(s + 1) == rank_) {
      auto& next = run.slots.at({s + 1, m});
      slot.output_grads = std::move(next.input_grads);
      next.input_grads.clear();
    }
  }
  TensorList roots, grads;
  if (last) {
    roots.push_back(slot.loss);
    grads.emplace_back();
  } else {
    for (std::size_t i = 0; i < slot.outputs.size(); ++i) {
      const auto& out = slot.outputs[i];
      if (!out.defined() || !out.requires_grad()) continue;
      if (i >= slot.output_grads.size() || !slot.output_grads[i].defined()) continue;
      roots.push_back(out);
      grads.push_back(slot.output_grads[i]);
    }
  }
  const bool final_pass = kind != ActionKind::kBackwardInput;
  if (final_pass && !ddp_.empty() && ddp_[c] && run.backwards_done[c] == schedule_.microbatches - 1)
    ddp_[c]->after_forward(roots);  // Note [Pipeline stages under DDP]: this pass reduces
  TensorList wanted;
  for (const auto& in : slot.inputs)
    if (s > 0 && in.defined() && in.requires_grad()) wanted.push_back(in);
  if (kind == ActionKind::kBackward) {
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    slot.input_grads.clear();
    for (const auto& in : slot.inputs)
      slot.input_grads.push_back(s > 0 && in.defined() && in.requires_grad() ? in.grad() : at::Tensor());
  } else if (kind == ActionKind::kBackwardInput) {
    // Note [Split backward]: the input gradients alone, keeping the graph for W.
    slot.input_grads.assign(slot.inputs.size(), at::Tensor());
    if (!roots.empty() && !wanted.empty()) {
      auto g = torch::autograd::grad(roots, wanted, grads, /*retain_graph=*/true, /*create_graph=*/false,
                                     /*allow_unused=*/true);
      std::size_t k = 0;
      for (std::size_t i = 0; i < slot.inputs.size(); ++i)
        if (s > 0 && slot.inputs[i].defined() && slot.inputs[i].requires_grad()) slot.input_grads[i] = g[k++];
    }
    // Note [Split backward]: W pairs slot.outputs with slot.output_grads by position
    // again, so output_grads stays as received (one per output, undefined where an
    // output gets none), never the compacted `grads`.
  } else {  // kBackwardWeight
    TensorList params;
    for (const auto& p : stages_[c].module()->parameters())
      if (p.requires_grad()) params.push_back(p);
    if (!roots.empty() && !params.empty())
      torch::autograd::backward(roots, grads, /*retain_graph=*/false, /*create_graph=*/false, params);
  }
  if (final_pass) {
    ++run.backwards_done[c];
    slot.outputs.clear();
    slot.loss = at::Tensor();
    slot.output_grads.clear();
    slot.rng.clear();
    slot.inputs.clear();
    if (slot.live) --run.live;
    slot.live = false;
  }
}

}  // namespace cohort::pipeline
