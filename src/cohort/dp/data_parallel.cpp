#include "cohort/dp/data_parallel.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/DeviceGuard.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>

#include "cohort/compat/autograd.h"
#include "cohort/amp/autocast_state.h"
#include "cohort/errors.h"

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

// Note [One CPU generator per replica]
std::mutex& cpu_generator_lease() {
  static std::mutex lease;
  return lease;
}
thread_local bool holds_cpu_generator = false;  // this thread runs a CPU replica's forward

// Runs a CPU replica's forward on the default CPU generator seeded with the
// replica's seed, then puts the generator's state back.
class CpuGeneratorLease {
 public:
  explicit CpuGeneratorLease(std::optional<std::uint64_t> seed) {
    if (!seed) return;
    lock_ = std::unique_lock<std::mutex>(cpu_generator_lease());
    holds_cpu_generator = true;
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> guard(gen.mutex());
    saved_ = gen.get_state();
    gen.set_current_seed(*seed);
  }
  ~CpuGeneratorLease() {
    if (!lock_.owns_lock()) return;
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> guard(gen.mutex());
    gen.set_state(saved_);
    holds_cpu_generator = false;
  }
  CpuGeneratorLease(const CpuGeneratorLease&) = delete;
  CpuGeneratorLease& operator=(const CpuGeneratorLease&) = delete;

 private:
  std::unique_lock<std::mutex> lock_;
  at::Tensor saved_;
};

// One seed per CPU replica that runs, drawn in the calling thread, where two or more
// replicas run on the CPU in training mode; none (the default generator, as a plain
// module) otherwise: in eval mode dropout draws nothing, and the replicas keep running
// at once, as LocalPipeline's parts do (Note [Generators of the device threads]). None
// either in a forward nested in a CPU replica's: its threads would wait for the lease
// that the thread waiting for them holds.
std::vector<std::optional<std::uint64_t>> replica_seeds(const std::vector<c10::Device>& devices,
                                                        const std::vector<std::shared_ptr<torch::nn::Module>>& replicas,
                                                        std::size_t running) {
  std::vector<std::optional<std::uint64_t>> seeds(running);
  std::size_t on_cpu = 0;
  bool training = false;
  for (std::size_t i = 0; i < running; ++i)
    if (devices[i].is_cpu()) {
      ++on_cpu;
      training = training || replicas[i]->is_training();
    }
  if (on_cpu < 2 || !training || holds_cpu_generator) return seeds;
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> guard(gen.mutex());
  for (std::size_t i = 0; i < running; ++i)
    if (devices[i].is_cpu()) seeds[i] = at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
  return seeds;
}

}  // namespace

DataParallelBase::DataParallelBase(std::shared_ptr<torch::nn::Module> module, MakeClones make_clones,
                                   DataParallelOptions options)
    : primary_(std::move(module)), make_clones_(std::move(make_clones)), options_(std::move(options)) {
  replicate();
}

// Note [Replicas made again]
std::vector<std::string> DataParallelBase::layout() const {
  std::vector<std::string> out;
  auto describe = [&out](const char* kind, const std::string& name, const at::Tensor& t) {
    out.push_back(t.defined() ? fmt::format("{} {} {} {} {}{}", kind, name, c10::str(t.sizes()),
                                            c10::toString(t.scalar_type()), t.device().str(),
                                            t.requires_grad() ? " requires_grad" : "")
                              : fmt::format("{} {} undefined", kind, name));
  };
  for (const auto& item : primary_->named_parameters(/*recurse=*/true)) describe("parameter", item.key(), item.value());
  for (const auto& item : primary_->named_buffers(/*recurse=*/true)) describe("buffer", item.key(), item.value());
  for (const auto& item : primary_->named_modules(/*name_prefix=*/"", /*include_self=*/false))
    out.push_back("module " + item.key());
  return out;
}

namespace {

// What differs between the module's layout when its replicas were made and now.
std::string change_between(const std::vector<std::string>& before, const std::vector<std::string>& now) {
  for (const auto& entry : now)
    if (std::find(before.begin(), before.end(), entry) == before.end()) return "now " + entry;
  for (const auto& entry : before)
    if (std::find(now.begin(), now.end(), entry) == now.end()) return "no longer " + entry;
  return "the same tensors in another order";
}

// The name of a tensor of the module that `clone` lacks, or empty.
std::string missing_from(const torch::nn::Module& module, const torch::nn::Module& clone) {
  const auto params = clone.named_parameters(), buffers = clone.named_buffers();
  for (const auto& item : module.named_parameters())
    if (!params.contains(item.key())) return "parameter '" + item.key() + "'";
  for (const auto& item : module.named_buffers())
    if (!buffers.contains(item.key())) return "buffer '" + item.key() + "'";
  return "";
}

}  // namespace

void DataParallelBase::replicate() {
  const bool again = !layout_.empty();
  const auto now = layout();
  const auto refuse = [&](const std::string& why) {
    throw ConfigError(fmt::format(
        "cohort DataParallel: the module changed since its replicas were made ({}), and they cannot be made again: "
        "{}. clone() makes a module's tensors by calling its reset(): register every parameter and buffer in "
        "reset() (a flag set before calling reset() may decide which)",
        change_between(layout_, now), why));
  };
  std::vector<std::shared_ptr<torch::nn::Module>> clones;
  try {
    clones = make_clones_();  // moves the module to devices[0] first
  } catch (const ConfigError& e) {
    if (!again) throw;
    std::string why = e.what();
    const std::string prefix = "cohort DataParallel: ";
    if (why.rfind(prefix, 0) == 0) why.erase(0, prefix.size());
    refuse(why);
  }
  for (std::size_t i = 0; i < clones.size(); ++i) {
    const auto missing = missing_from(*primary_, *clones[i]);
    if (missing.empty()) continue;
    const auto why = fmt::format("the clone for replica {} has no {}", i + 1, missing);
    if (again) refuse(why);
    throw ConfigError("cohort DataParallel: " + why +
                      "; clone() makes a module's tensors by calling its reset(): register every parameter and buffer "
                      "in reset()");
  }
  replicas_.clear();
  replicas_.push_back(primary_);
  for (auto& c : clones) replicas_.push_back(std::move(c));
  link_gradients();
  layout_ = layout();
}

void DataParallelBase::link_gradients() {
  const auto originals = replicas_[0]->named_parameters(/*recurse=*/true);
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
      auto node = compat::make_node<ToModuleParameter>(original.device());
      node->set_next_edges(torch::autograd::collect_next_edges(original));
      torch::autograd::set_history(copy, node);
    }
  }
}

void DataParallelBase::synchronize() {
  // A module that changed since the replicas were made (a tensor registered late,
  // another dtype, a flipped requires_grad) is replicated again, as PyTorch does at
  // every call; else the copies below would index past the replicas' tensors.
  if (layout() != layout_) replicate();
  at::NoGradGuard no_grad;
  const auto params = replicas_[0]->parameters();
  const auto buffers = replicas_[0]->buffers();
  const auto modules = replicas_[0]->modules(/*include_self=*/true);
  for (std::size_t r = 1; r < replicas_.size(); ++r) {
    // train()/eval() set on the module reach the replicas (pre-order, so a child's
    // own mode wins over its parent's).
    auto theirs_modules = replicas_[r]->modules(/*include_self=*/true);
    TORCH_INTERNAL_ASSERT(theirs_modules.size() == modules.size(), "a replica with another module count");
    for (std::size_t k = 0; k < modules.size(); ++k) theirs_modules[k]->train(modules[k]->is_training());
    // Only what differs is copied: a copy bumps the version of a tensor a live graph
    // may have saved (two forwards before one backward, as siamese losses do).
    auto mine = replicas_[r]->parameters();
    TORCH_INTERNAL_ASSERT(mine.size() == params.size(), "a replica with another parameter count");
    for (std::size_t k = 0; k < params.size(); ++k)
      if (!at::equal(mine[k], params[k].to(mine[k].device()))) mine[k].copy_(params[k]);
    auto theirs = replicas_[r]->buffers();
    TORCH_INTERNAL_ASSERT(theirs.size() == buffers.size(), "a replica with another buffer count");
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
  const auto seeds = replica_seeds(devices, replicas_, chunks.size());
  auto work = [&](std::size_t i) {
    try {
      CpuGeneratorLease generator(seeds[i]);  // Note [One CPU generator per replica]
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
