#include "cohort/dp/data_parallel.h"

#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/DeviceGuard.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <thread>

#include "cohort/amp/autocast_state.h"

namespace cohort::dp {

namespace {

// A replica parameter's grad_fn: hands its gradient, moved to the module's device,
// to the module's parameter (Note [Replicas that stay]).
struct ToModuleParameter : torch::autograd::Node {
  explicit ToModuleParameter(c10::Device device) : device_(device) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (grads.empty() || !grads[0].defined()) return {at::Tensor()};
    return {grads[0].to(device_)};
  }
  std::string name() const override { return "cohort::dp::ToModuleParameter"; }

 private:
  c10::Device device_;
};

}  // namespace

DataParallelBase::DataParallelBase(std::shared_ptr<torch::nn::Module> module,
                                   std::vector<std::shared_ptr<torch::nn::Module>> clones, DataParallelOptions options)
    : options_(std::move(options)) {
  replicas_.push_back(std::move(module));
  for (auto& c : clones) replicas_.push_back(std::move(c));
  link_gradients();
}

void DataParallelBase::link_gradients() {
  const auto originals = replicas_[0]->named_parameters(/*recurse=*/true);
  for (const auto& item : originals) linked_.push_back(item.value().requires_grad());
  for (std::size_t r = 1; r < replicas_.size(); ++r) {
    auto copies = replicas_[r]->named_parameters(/*recurse=*/true);
    TORCH_INTERNAL_ASSERT(copies.size() == originals.size(), "a replica with another parameter count");
    for (std::size_t k = 0; k < originals.size(); ++k) {
      const auto& original = originals[k].value();
      auto copy = copies[k].value();
      TORCH_INTERNAL_ASSERT(copies[k].key() == originals[k].key(), "replica parameter ", copies[k].key(),
                            " in place of ", originals[k].key());
      if (!original.requires_grad()) {
        copy.requires_grad_(false);
        continue;
      }
      auto node = std::make_shared<ToModuleParameter>(original.device());
      node->set_next_edges(torch::autograd::collect_next_edges(original));
      torch::autograd::set_history(copy, node);
    }
  }
}

void DataParallelBase::synchronize() {
  at::NoGradGuard no_grad;
  const auto params = replicas_[0]->parameters();
  // The gradient edges were laid for the flags at construction (link_gradients).
  const auto named = replicas_[0]->named_parameters();
  for (std::size_t k = 0; k < named.size(); ++k)
    if (named[k].value().requires_grad() != linked_[k])
      throw ConfigError(fmt::format(
          "cohort DataParallel: parameter '{}' {} since the DataParallel was built, so the replicas' gradients "
          "would not reach it; set requires_grad before building the DataParallel, or build it again",
          named[k].key(), linked_[k] ? "stopped requiring gradients" : "started requiring gradients"));
  const auto buffers = replicas_[0]->buffers();
  const auto modules = replicas_[0]->modules(/*include_self=*/true);
  for (std::size_t r = 1; r < replicas_.size(); ++r) {
    // train()/eval() set on the module reach the replicas (pre-order, so a child's
    // own mode wins over its parent's).
    auto theirs_modules = replicas_[r]->modules(/*include_self=*/true);
    for (std::size_t k = 0; k < modules.size(); ++k) theirs_modules[k]->train(modules[k]->is_training());
    // Only what differs is copied: a copy bumps the version of a tensor a live graph
    // may have saved (two forwards before one backward, as siamese losses do).
    auto mine = replicas_[r]->parameters();
    for (std::size_t k = 0; k < params.size(); ++k)
      if (!at::equal(mine[k], params[k].to(mine[k].device()))) mine[k].copy_(params[k]);
    auto theirs = replicas_[r]->buffers();
    for (std::size_t k = 0; k < buffers.size(); ++k)
      if (buffers[k].defined() && !at::equal(theirs[k], buffers[k].to(theirs[k].device()))) theirs[k].copy_(buffers[k]);
  }
}

at::Tensor DataParallelBase::run(const at::Tensor& input,
                                 const std::function<at::Tensor(std::size_t, const at::Tensor&)>& forward_one) {
  const auto& devices = options_.devices();
  const auto dim = options_.dim();
  if (input.dim() <= dim || input.size(dim) == 0)
    throw ConfigError(fmt::format("cohort DataParallel: cannot scatter an input of shape {} along dimension {}",
                                  c10::str(input.sizes()), dim));
  synchronize();
  // torch.chunk's sizes, as PyTorch's scatter: a batch smaller than the replica
  // count runs on fewer replicas.
  auto chunks = input.chunk(static_cast<std::int64_t>(replicas_.size()), dim);
  std::vector<at::Tensor> outputs(chunks.size());
  std::vector<std::string> failures(chunks.size());
  // Note [State of the device threads] (pipeline/local_pipeline.cpp), plus autocast's dtype.
  const at::ThreadLocalState state;
  const auto autocast = amp::AutocastState::capture();
  auto work = [&](std::size_t i) {
    try {
      at::ThreadLocalStateGuard guard(state);
      autocast.apply();
      c10::OptionalDeviceGuard device_guard(devices[i]);
      outputs[i] = forward_one(i, chunks[i].to(devices[i]));
    } catch (const std::exception& e) {
      failures[i] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t i = 1; i < chunks.size(); ++i) threads.emplace_back(work, i);
  work(0);
  for (auto& t : threads) t.join();
  for (std::size_t i = 0; i < chunks.size(); ++i)
    if (!failures[i].empty())
      throw Error(fmt::format("cohort DataParallel: replica {} on {} failed in forward: {}", i, devices[i].str(),
                              failures[i]));
  const auto out_device = options_.output_device().value_or(devices[0]);
  for (auto& o : outputs) o = o.to(out_device);
  return at::cat(outputs, dim);
}

}  // namespace cohort::dp
