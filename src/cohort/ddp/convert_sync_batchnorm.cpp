#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cohort/ddp/sync_batch_norm.h"
#include "cohort/errors.h"

// convert_sync_batchnorm: swapping a model's BatchNorm layers for SyncBatchNorm.
namespace cohort::ddp {

namespace {

using torch::nn::Module;

template <typename BatchNorm>
std::shared_ptr<SyncBatchNormImpl> sync_copy(const BatchNorm& bn, const comm::Group& group) {
  const auto& o = bn.options;
  auto sync = std::make_shared<SyncBatchNormImpl>(SyncBatchNormOptions(o.num_features())
                                                      .eps(o.eps())
                                                      .momentum(o.momentum())
                                                      .affine(o.affine())
                                                      .track_running_stats(o.track_running_stats())
                                                      .group(group));
  const std::pair<at::Tensor*, const at::Tensor*> state[] = {
      {&sync->weight, &bn.weight},
      {&sync->bias, &bn.bias},
      {&sync->running_mean, &bn.running_mean},
      {&sync->running_var, &bn.running_var},
      {&sync->num_batches_tracked, &bn.num_batches_tracked}};
  for (const auto& [to, from] : state) {
    if (!to->defined() || !from->defined()) continue;
    // set_data keeps the registered tensor and takes device, dtype and values.
    to->set_data(from->detach().clone());
    to->set_requires_grad(from->requires_grad());
  }
  sync->train(bn.is_training());
  return sync;
}

// The replacement for `module`, or null when it is no torch::nn::BatchNorm.
std::shared_ptr<SyncBatchNormImpl> sync_copy_of(const Module& module, const comm::Group& group) {
  if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module)) return sync_copy(*bn, group);
  if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module)) return sync_copy(*bn, group);
  if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module)) return sync_copy(*bn, group);
  return nullptr;
}

// The channels of a torch::nn::BatchNorm, or 0 for any other module.
std::int64_t batch_norm_features(const Module& m) {
  if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m)) return bn->options.num_features();
  if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m)) return bn->options.num_features();
  if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m)) return bn->options.num_features();
  return 0;
}

// Containers call their children through the same pointers they list, so a swap
// there changes both what forward runs and what parameters() returns.
bool is_container(const Module& m) {
  return dynamic_cast<const torch::nn::SequentialImpl*>(&m) || dynamic_cast<const torch::nn::ModuleListImpl*>(&m) ||
         dynamic_cast<const torch::nn::ModuleDictImpl*>(&m);
}

struct Swap {
  Module* parent;
  std::string name;
  std::shared_ptr<Module> old_child;
};

// Finds every BatchNorm to swap, throwing before anything changed if one cannot be.
void plan_swaps(Module& m, const std::string& path, std::unordered_set<const Module*>& seen,
                std::vector<Swap>& swaps) {
  if (!seen.insert(&m).second) return;  // a shared submodule, planned already
  for (const auto& item : m.named_children()) {
    const auto child_path = path.empty() ? item.key() : path + "." + item.key();
    const auto features = batch_norm_features(*item.value());
    if (features == 0) {
      plan_swaps(*item.value(), child_path, seen, swaps);
    } else if (is_container(m)) {
      swaps.push_back({&m, item.key(), item.value()});
    } else {
      throw ConfigError(fmt::format(
          "cohort: convert_sync_batchnorm: the {} at '{}' is a field of {}, and a LibTorch module calls such "
          "a field directly, so swapping it would leave forward() using the old layer; build that layer as "
          "cohort::ddp::SyncBatchNorm(SyncBatchNormOptions({}).group(world.group())) or hold it in a "
          "torch::nn::Sequential. Nothing was converted",
          item.value()->name(), child_path, path.empty() ? m.name() : fmt::format("{} '{}'", m.name(), path), features));
    }
  }
}

void swap_in(const Swap& swap, const std::shared_ptr<SyncBatchNormImpl>& sync) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(swap.parent)) {
    for (auto& any : *seq)
      if (any.ptr() == swap.old_child) any = torch::nn::AnyModule(sync);
  } else if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(swap.parent)) {
    for (auto& child : *list)
      if (child == swap.old_child) child = sync;
  } else if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(swap.parent)) {
    dict->update({{swap.name, sync}});  // replaces the entry and the registration
    return;
  }
  swap.parent->replace_module(swap.name, sync);
}

}  // namespace

int convert_sync_batchnorm(const std::shared_ptr<Module>& module, const comm::Group& group) {
  if (!module) throw ConfigError("cohort: convert_sync_batchnorm was given a null module");
  if (batch_norm_features(*module) > 0)
    throw ConfigError(fmt::format("cohort: convert_sync_batchnorm cannot replace the module it is given, a {}; "
                                  "build a cohort::ddp::SyncBatchNorm instead",
                                  module->name()));
  std::unordered_set<const Module*> seen;
  std::vector<Swap> swaps;
  plan_swaps(*module, "", seen, swaps);
  // A BatchNorm shared by two containers stays shared.
  std::unordered_map<const Module*, std::shared_ptr<SyncBatchNormImpl>> replacement;
  for (const auto& swap : swaps) {
    auto& sync = replacement[swap.old_child.get()];
    if (!sync) sync = sync_copy_of(*swap.old_child, group);
    swap_in(swap, sync);
  }
  return static_cast<int>(replacement.size());
}

}  // namespace cohort::ddp
