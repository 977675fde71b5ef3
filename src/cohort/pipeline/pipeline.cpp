#include "cohort/pipeline/pipeline.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "cohort/checkpoint/rng_state.h"
#include "cohort/checkpoint/state_dict.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "cohort/pipeline/wire.h"
#include "cohort/trace/timeline.h"

namespace cohort::pipeline {

namespace {

using Clock = std::chrono::steady_clock;

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

// The state of one (stage, micro-batch) during a step.
struct Pipeline::Slot {
  TensorList inputs;        // leaves for stages > 0 (as_stage_inputs), data for stage 0
  TensorList outputs;       // with their graph, until backward
  at::Tensor loss;          // last stage: the weighted loss, the root of backward
  TensorList output_grads;  // received, or handed over by the local next stage
  TensorList input_grads;   // produced by B/I, until sent or handed over
  std::vector<at::Tensor> rng;  // recompute: the generators before forward
  bool live = false;
};

struct Pipeline::Run {
  const std::vector<TensorList>* inputs = nullptr;
  const std::vector<TensorList>* targets = nullptr;
  std::vector<double> weights;
  double loss_scale = 1.0;
  std::map<std::pair<int, int>, Slot> slots;
  std::vector<Sent> sends;
  std::vector<double> losses;
  std::vector<int> backwards_done;  // per local chunk: B or W passes run this step
  std::vector<bool> started;        // per local chunk: a forward ran this step
  int live = 0;
  int peak = 0;
  double compute = 0;
};

Pipeline::Pipeline(std::vector<PipelineStage> stages, comm::Group group, PipelineOptions options)
    : stages_(std::move(stages)), group_(std::move(group)), options_(std::move(options)) {
  if (!group_.is_member())
    throw ConfigError("cohort pipeline: this rank is not a member of the pipeline group it was given");
  if (!options_.loss()) throw ConfigError("cohort pipeline: PipelineOptions needs a loss function");
  rank_ = group_.rank();
  check_agreement();
  schedule_ = make_schedule(ScheduleOptions()
                                .kind(options_.schedule())
                                .ranks(group_.size())
                                .microbatches(options_.microbatches())
                                .virtual_stages(options_.virtual_stages()));
  simulated_ = simulate(schedule_);  // throws if the lists would deadlock
  local_module_ = std::make_shared<torch::nn::Module>("PipelineStages");
  for (const auto& stage : stages_) {
    for (const auto& [name, child] : stage.state_children()) local_module_->register_module(name, child);
  }
}

Pipeline::~Pipeline() = default;
Pipeline::Pipeline(Pipeline&&) noexcept = default;
Pipeline& Pipeline::operator=(Pipeline&&) noexcept = default;

// Every rank must agree on the schedule before the first message, or ranks would
// wait for messages that never come. One all_gather of fixed-size settings tells
// every rank what every other has, so all refuse together, naming the differences.
void Pipeline::check_agreement() {
  constexpr int kMaxChunks = 16;
  const int p = group_.size();
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(options_.schedule()), options_.microbatches(),
                                 options_.virtual_stages(), options_.recompute() ? 1 : 0,
                                 static_cast<std::int64_t>(stages_.size())};
  for (int c = 0; c < kMaxChunks; ++c)
    mine.push_back(c < static_cast<int>(stages_.size()) ? stages_[c].index() : -1);
  auto t = at::tensor(mine, at::TensorOptions().dtype(at::kLong)).to(options_.device());
  auto all = group_.all_gather(t);
  auto describe = [&](const at::Tensor& x) {
    auto v = x.cpu();
    auto* d = v.data_ptr<std::int64_t>();
    std::vector<std::int64_t> idx;
    for (int c = 0; c < std::min<std::int64_t>(d[4], kMaxChunks); ++c) idx.push_back(d[5 + c]);
    return fmt::format("schedule {}, {} micro-batches, {} virtual stages, recompute {}, stages [{}]",
                       to_string(static_cast<ScheduleKind>(d[0])), d[1], d[2], d[3] ? "on" : "off",
                       fmt::join(idx, ", "));
  };
  std::vector<std::string> problems;
  const auto reference = all[0].cpu();
  for (int r = 0; r < p; ++r) {
    auto v = all[r].cpu();
    auto* d = v.data_ptr<std::int64_t>();
    bool same = at::equal(v.narrow(0, 0, 4), reference.narrow(0, 0, 4));
    bool placed = d[4] == d[2] && d[4] <= kMaxChunks;
    for (int c = 0; placed && c < d[4]; ++c) placed = d[5 + c] == r + c * p;
    if (!same || !placed) problems.push_back(fmt::format("pipeline rank {}: {}", r, describe(all[r])));
  }
  if (!problems.empty())
    throw ConfigError(fmt::format(
        "cohort pipeline: the ranks of pipeline group '{}' disagree. Each must pass the same schedule, micro-batch "
        "count, virtual stages and recompute setting, and pipeline rank r must hold stages r, r+{}, ... (one per "
        "virtual stage). Rank 0 has: {}; these differ: {}. Fix the flags or the stage assignment so every rank "
        "agrees",
        group_.name(), p, describe(all[0]), fmt::join(problems, "; ")));
  if (options_.virtual_stages() != static_cast<int>(stages_.size()))
    throw ConfigError(fmt::format("cohort pipeline: {} virtual stages but this rank passed {} stages; pass one "
                                  "stage per virtual stage",
                                  options_.virtual_stages(), stages_.size()));
}

void Pipeline::data_parallel(comm::Group data_group, ddp::DistributedDataParallelOptions options) {
  if (data_parallel_) throw ConfigError("cohort pipeline: data_parallel() was already called");
  // A stage with nothing to train (a reshape, an activation) has no gradients to
  // reduce: it gets no DDP, on every replica alike, since they hold the same stages.
  for (const auto& stage : stages_) {
    const auto params = stage.module()->parameters();
    const bool trainable = std::any_of(params.begin(), params.end(), [](const at::Tensor& p) { return p.requires_grad(); });
    ddp_.push_back(trainable ? std::make_unique<ddp::DistributedDataParallelBase>(stage.module(), data_group, options)
                             : nullptr);
  }
  data_parallel_ = true;
}

bool Pipeline::is_first() const { return rank_ == schedule_.rank_of(0); }
bool Pipeline::is_last() const { return rank_ == schedule_.rank_of(schedule_.stages() - 1); }

int Pipeline::local_index(int stage) const {
  TORCH_INTERNAL_ASSERT(schedule_.rank_of(stage) == rank_, "stage ", stage, " is not on pipeline rank ", rank_);
  return schedule_.chunk_of(stage);
}

std::vector<at::Tensor> Pipeline::parameters() const { return local_module_->parameters(); }
std::shared_ptr<torch::nn::Module> Pipeline::local_module() const { return local_module_; }

namespace {

std::vector<TensorList> cut(const TensorList& batch, int parts, const char* what) {
  std::vector<TensorList> out(parts);
  for (const auto& t : batch) {
    if (t.dim() == 0 || t.size(0) < parts)
      throw ConfigError(fmt::format("cohort pipeline: cannot cut the {} (shape {}) into {} micro-batches along "
                                    "dimension 0; use a batch of at least {} rows or fewer micro-batches",
                                    what, c10::str(t.sizes()), parts, parts));
    auto pieces = t.tensor_split(parts, 0);
    for (int m = 0; m < parts; ++m) out[m].push_back(pieces[m]);
  }
  return out;
}

}  // namespace

StepResult Pipeline::step(const TensorList& inputs, const TensorList& targets, double loss_scale) {
  const int m = options_.microbatches();
  return step_microbatches(is_first() ? cut(inputs, m, "inputs") : std::vector<TensorList>(),
                           is_last() ? cut(targets, m, "targets") : std::vector<TensorList>(), loss_scale);
}

namespace {

// Each micro-batch's rows: its first tensor's size along dimension 0 (0 for none).
std::vector<std::int64_t> rows_of(const std::vector<TensorList>& microbatches) {
  std::vector<std::int64_t> rows;
  for (const auto& list : microbatches)
    rows.push_back(!list.empty() && list[0].defined() && list[0].dim() > 0 ? list[0].size(0) : 0);
  return rows;
}

constexpr int kRowsTag = 0xFE;  // a stage number no step uses (kStateTag is 0xFF)

}  // namespace

// Note [Micro-batch weights]: the last stage weighs a loss without targets by the
// micro-batches' input rows. The first stage sends them at the start of every step
// (the message precedes every other between the two ranks on both sides, so NCCL's
// issue order matches too); the last rank returns them, the others nothing.
std::vector<std::int64_t> Pipeline::exchange_input_rows(Run& run, const std::vector<TensorList>& inputs) {
  const int first = schedule_.rank_of(0);
  const int last = schedule_.rank_of(schedule_.stages() - 1);
  if (first == last) return is_first() ? rows_of(inputs) : std::vector<std::int64_t>();
  if (!is_first() && !is_last()) return {};
  const auto tag = transfer_tag(Direction::kActivation, kRowsTag, 0, 0);
  auto counts = at::zeros({options_.microbatches()}, at::TensorOptions().dtype(at::kLong));
  if (is_first()) {
    const auto rows = rows_of(inputs);
    std::copy(rows.begin(), rows.end(), counts.data_ptr<std::int64_t>());
    auto sent = counts.to(options_.device());
    run.sends.push_back(Sent{{group_.send_async(sent, last, tag)}, {sent}});  // waited for with the step's others
    return {};
  }
  auto received = counts.to(options_.device());
  try {
    group_.recv(received, first, tag);
  } catch (const TimeoutError& e) {
    throw TimeoutError(fmt::format("cohort pipeline: pipeline rank {} (global rank {}), the last stage, did not "
                                   "receive the micro-batches' row counts from the first stage (global rank {}) "
                                   "within the timeout; it is stuck or far behind. {}",
                                   rank_, group_.global_ranks()[rank_], group_.global_ranks()[first], e.what()),
                       e.operation(), e.missing_ranks());
  }
  auto host = received.cpu();
  return std::vector<std::int64_t>(host.data_ptr<std::int64_t>(), host.data_ptr<std::int64_t>() + host.numel());
}

std::unique_ptr<amp::Autocast> Pipeline::autocast() const {
  return options_.autocast() ? std::make_unique<amp::Autocast>(*options_.autocast()) : nullptr;
}

StepResult Pipeline::step_microbatches(const std::vector<TensorList>& inputs,
                                       const std::vector<TensorList>& targets, double loss_scale) {
  const int m = options_.microbatches();
  if (is_first() && static_cast<int>(inputs.size()) != m)
    throw ConfigError(fmt::format("cohort pipeline: the first stage got {} micro-batches of inputs but the pipeline "
                                  "runs {}",
                                  inputs.size(), m));
  if (is_last() && !targets.empty() && static_cast<int>(targets.size()) != m)
    throw ConfigError(fmt::format("cohort pipeline: the last stage got {} micro-batches of targets but the pipeline "
                                  "runs {}",
                                  targets.size(), m));
  at::AutoGradMode grad_on(true);
  const auto start = Clock::now();
  Run run;
  run.inputs = &inputs;
  run.targets = &targets;
  run.loss_scale = loss_scale;
  run.losses.assign(m, 0.0);
  run.backwards_done.assign(stages_.size(), 0);
  run.started.assign(stages_.size(), false);
  // Note [Micro-batch weights]: each micro-batch's mean loss is weighted by its share
  // of the rows, so the summed gradient is the gradient of the whole batch's mean
  // loss, whatever the cut (tensor_split's chunks may differ by a row).
  // A loss that takes no targets weighs each micro-batch by its first input's rows,
  // which only the first stage sees: it sends their counts to the last stage first.
  run.weights.assign(m, 1.0 / m);
  const auto input_rows = exchange_input_rows(run, inputs);
  const bool by_targets = !targets.empty() && !targets[0].empty();
  const auto rows = is_last() ? (by_targets ? rows_of(targets) : input_rows) : std::vector<std::int64_t>();
  double total = 0;
  for (auto r : rows) total += static_cast<double>(r);
  if (total > 0)
    for (int k = 0; k < m; ++k) run.weights[k] = static_cast<double>(rows[k]) / total;

  for (const auto& action : schedule_.actions[rank_]) run_action(run, action);
  try {
    for (auto& sent : run.sends)
      for (auto& p : sent.pending) p.wait();
  } catch (const TimeoutError& e) {
    throw TimeoutError(fmt::format("cohort pipeline: pipeline rank {} (global rank {}): a send of this step was not "
                                   "received within the timeout. {}",
                                   rank_, group_.global_ranks()[rank_], e.what()),
                       e.operation(), e.missing_ranks());
  }

  // Every rank gets the losses, for logging, and the weighted mean after them (only
  // the last stage knows the weights).
  double mean = 0;
  for (int k = 0; k < m; ++k) mean += run.weights[k] * run.losses[k];
  run.losses.push_back(mean);
  auto losses = at::tensor(run.losses, at::TensorOptions().dtype(at::kDouble)).to(options_.device());
  group_.broadcast(losses, schedule_.rank_of(schedule_.stages() - 1));
  auto host = losses.cpu();
  StepResult result;
  result.losses.assign(host.data_ptr<double>(), host.data_ptr<double>() + m);
  result.loss = host.data_ptr<double>()[m];
  result.step_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.compute_seconds = run.compute;
  result.peak_live_microbatches = run.peak;
  return result;
}

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

TensorList Pipeline::forward(const TensorList& inputs, int microbatches, bool mixed_precision) {
  at::NoGradGuard no_grad;
  auto mixed = mixed_precision ? autocast() : nullptr;
  const int stages = schedule_.stages();
  std::vector<TensorList> pieces = is_first() ? cut(inputs, microbatches, "inputs") : std::vector<TensorList>();
  std::vector<TensorList> outputs;
  std::vector<Sent> sends;
  for (int m = 0; m < microbatches; ++m) {
    TensorList carried;
    for (std::size_t c = 0; c < stages_.size(); ++c) {
      const int s = stages_[c].index();
      TensorList in;
      if (s == 0) in = pieces.at(m);
      else if (schedule_.rank_of(s - 1) == rank_) in = carried;
      else in = recv_tensors(group_, schedule_.rank_of(s - 1), Direction::kActivation, s, m, options_.device());
      carried = stages_[c].forward(in);
      if (s == stages - 1) outputs.push_back(carried);
      else if (schedule_.rank_of(s + 1) != rank_)
        sends.push_back(send_tensors(group_, carried, schedule_.rank_of(s + 1), Direction::kActivation, s + 1, m,
                                     options_.device()));
    }
  }
  for (auto& sent : sends)
    for (auto& p : sent.pending) p.wait();
  if (!is_last()) return {};
  TensorList joined;
  for (std::size_t i = 0; i < outputs.front().size(); ++i) {
    TensorList parts;
    for (const auto& o : outputs) parts.push_back(o[i]);
    joined.push_back(at::cat(parts, 0));
  }
  return joined;
}

namespace {

// Note [Assembling the state dict]
// A stage may have more entries than one transfer carries (wire.h's limits on
// tensors and header slots), so each stage's state dict travels as a series of
// transfers to pipeline rank 0: first its names ('\n'-separated bytes) with the
// number of transfers that follow, then its tensors in groups that fit. The
// transfers are numbered in the micro-batch field of the tag under a stage number
// no step uses; rank 0 receives them in the order they were sent.
constexpr int kStateTag = 0xFF;

std::vector<TensorList> fitting_groups(const TensorList& tensors) {
  std::vector<TensorList> groups(1);
  std::int64_t slots = 1;  // the header's count
  for (const auto& t : tensors) {
    const std::int64_t need = 2 + t.dim();
    if (static_cast<int>(groups.back().size()) == kMaxWireTensors || slots + need > kHeaderSlots) {
      groups.emplace_back();
      slots = 1;
    }
    groups.back().push_back(t);
    slots += need;
  }
  return groups;
}

c10::Dict<std::string, at::Tensor> entries_of(const PipelineStage& stage) {
  torch::nn::Module holder;
  for (const auto& [name, child] : stage.state_children()) holder.register_module(name, child);
  return checkpoint::state_dict(holder);
}

}  // namespace

c10::Dict<std::string, at::Tensor> Pipeline::full_state_dict() {
  std::map<int, c10::Dict<std::string, at::Tensor>> by_stage;
  int sequence = 0;  // transfers between this rank and rank 0, in order
  if (rank_ != 0) {
    std::vector<Sent> sends;
    for (const auto& stage : stages_) {
      auto dict = entries_of(stage);
      std::string names;  // never empty: some transports refuse a message of no bytes
      TensorList tensors;
      for (const auto& item : dict) {
        names += item.key() + "\n";
        tensors.push_back(item.value().to(options_.device()));
      }
      if (names.empty()) names = "\n";
      auto groups = fitting_groups(tensors);
      auto name_bytes = at::empty({static_cast<std::int64_t>(names.size())}, at::TensorOptions().dtype(at::kByte));
      std::memcpy(name_bytes.data_ptr(), names.data(), names.size());
      auto count = at::tensor(std::vector<std::int64_t>{static_cast<std::int64_t>(groups.size())},
                              at::TensorOptions().dtype(at::kLong));
      sends.push_back(send_tensors(group_, {name_bytes.to(options_.device()), count.to(options_.device())}, 0,
                                   Direction::kActivation, kStateTag, sequence++, options_.device()));
      for (const auto& g : groups)
        sends.push_back(
            send_tensors(group_, g, 0, Direction::kActivation, kStateTag, sequence++, options_.device()));
    }
    for (auto& sent : sends)
      for (auto& p : sent.pending) p.wait();
    return c10::Dict<std::string, at::Tensor>();
  }
  for (const auto& stage : stages_) by_stage[stage.index()] = entries_of(stage);
  for (int r = 1; r < group_.size(); ++r) {
    sequence = 0;
    for (int c = 0; c < schedule_.virtual_stages; ++c) {
      auto head = recv_tensors(group_, r, Direction::kActivation, kStateTag, sequence++, options_.device());
      auto bytes = head.at(0).cpu();
      std::string names(reinterpret_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel()));
      const auto groups = head.at(1).cpu().item<std::int64_t>();
      c10::Dict<std::string, at::Tensor> dict;
      std::size_t start = 0;
      for (std::int64_t g = 0; g < groups; ++g)
        for (const auto& t : recv_tensors(group_, r, Direction::kActivation, kStateTag, sequence++, options_.device())) {
          auto end = names.find('\n', start);
          dict.insert(names.substr(start, end - start), t.cpu());
          start = end + 1;
        }
      by_stage[r + c * group_.size()] = dict;
    }
  }
  c10::Dict<std::string, at::Tensor> whole;
  for (const auto& [stage, dict] : by_stage)
    for (const auto& item : dict) {
      if (whole.contains(item.key()))
        throw ConfigError(fmt::format("cohort pipeline: '{}' appears in two stages; give hand-written stages distinct "
                                      "state prefixes",
                                      item.key()));
      whole.insert(item.key(), item.value());
    }
  return whole;
}

}  // namespace cohort::pipeline
