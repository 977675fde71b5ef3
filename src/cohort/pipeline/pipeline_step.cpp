// Pipeline's training step: cutting the batch into micro-batches, weighing them
// (Note [Micro-batch weights]), running this rank's actions; and the forward-only pass.
#include "cohort/pipeline/pipeline.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "cohort/errors.h"
#include "cohort/pipeline/pipeline_internal.h"
#include "cohort/pipeline/wire.h"

namespace cohort::pipeline {

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

constexpr int kRowsTag = 0xFE;  // a stage number no step uses (kStateTag, pipeline_state.cpp, is 0xFF)

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

}  // namespace cohort::pipeline
