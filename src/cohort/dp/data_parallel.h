#pragma once
// DataParallel: one process, one replica of the model per device, each running a
// slice of the batch on its own thread; gradients are summed into the original
// module's parameters. The seeds' nn.DataParallel, done the way LibTorch's
// torch::nn::parallel::data_parallel does not: it clones the whole module on every
// call (pytorch#40581) and refuses CPU devices (pytorch#18837).
//
//   cohort::dp::DataParallel<Net> dp(net, cohort::dp::DataParallelOptions({torch::kCUDA, 0}, {torch::kCUDA, 1}));
//   torch::optim::SGD opt(net->parameters(), 0.1);      // the original module's parameters
//   for (auto& batch : loader) {
//     opt.zero_grad();
//     auto loss = torch::nll_loss(dp.forward(batch.data), batch.target);   // output on devices[0]
//     loss.backward();                                   // gradients summed into net's
//     opt.step();                                        // replicas follow at the next forward
//   }
//
// Prefer DistributedDataParallel (ddp/), even on one machine: one process per device
// has no interpreter-style lock to share, no per-step copy of the weights to the
// replicas, and no replica threads contending for one process's memory allocator;
// PyTorch's own documentation says the same. DataParallel is for a quick start on
// one machine, and for code that must stay in one process.
//
// Note [Replicas that stay]
// The replicas are cloned once, at construction; replica 0 is the module itself.
// Each other replica's parameters get an autograd edge to the same parameter of the
// module (through a node that moves the gradient to the module's device), so backward
// sums every replica's gradient into the module's .grad, and the replicas keep none.
// Before each forward the module's parameters and buffers are copied into the
// replicas' own storage (no allocation; LibTorch's optimizers update parameters
// through .data(), which leaves no version counter to tell a changed parameter by),
// so a replica always runs the weights the optimizer left, and buffers (BatchNorm's
// running statistics) come from replica 0, as in PyTorch. The modules' train/eval
// modes are copied too.
//
// Note [Replicas made again]
// PyTorch replicates the module at every call, so a module changed after the
// DataParallel was built just works there. Here the replicas stay, so each forward
// compares the module's parameters and buffers (names, shapes, dtypes, devices,
// requires_grad) with what they were when the replicas were made; if anything
// differs (a buffer or parameter registered late, module->to(kDouble), a parameter
// frozen or unfrozen) the replicas are cloned again and their gradient edges laid
// again before the forward. A forward whose module did not change pays one pass over
// the tensors' metadata. LibTorch's clone() makes a module's tensors by calling its
// reset() and copies the values in by name, so a tensor registered outside reset()
// cannot be cloned (LibTorch refuses, and a Sequential's clone drops the tensors
// registered on the Sequential itself): then the forward refuses with a ConfigError
// naming the tensor, where indexing the replicas' shorter tensor lists used to read
// past their end or crash.
//
// Note [One CPU generator per replica]
// CPU replicas all run on the CPU, whose random generator is one for the process:
// LibTorch 1.13 has no thread-local default generator, and dropout and the other
// random operators draw from the default one with no way to pass another. Replica
// threads drawing from it at once draw in an order set by the scheduler, so dropout
// is not reproducible under a fixed seed, and a checkpointed segment (recompute/)
// that captured the generator's state before another replica drew from it recomputes
// with other masks. So, where two or more replicas are on the CPU, the calling thread
// draws one seed per CPU replica from the default CPU generator (results depend on
// the seed only), and each CPU replica runs its forward holding a process-wide lease
// on the default CPU generator: it saves the generator's state, seeds it with its own
// seed, runs, and puts the saved state back. The generator seen by the replica's
// thread is then the replica's own, and recompute's capture and restore of "the CPU
// generator" (Note [Recomputing exactly]) act on that one: its backward restores the
// state captured inside the replica's forward, then the state it found. The cost: CPU
// replicas in training mode run their forwards one at a time (each operator still
// uses the intra-op thread pool; in eval mode, where dropout draws nothing, they run
// at once and draw from the default generator), and a forward nested in a replica (a
// DataParallel inside a replica) runs without leasing again, so its replicas are not
// reproducible. Other threads of the program that draw from the default CPU generator
// during a forward draw from a replica's stream, as they raced with the replicas
// before. CUDA replicas on distinct devices each use their device's generator and
// need none of this; two replicas on the same CUDA device still share its generator.
// LocalPipeline does the same for parts sharing a device (Note [Generators of the
// device threads] in pipeline/local_pipeline.cpp), with a lease per call; this one is
// process-wide, so two DataParallels forwarding at once from two threads do not
// swap the generator under each other.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/errors.h"

namespace cohort::dp {

struct DataParallelOptions {
  DataParallelOptions(std::vector<c10::Device> devices) : devices_(std::move(devices)) {}  // NOLINT: implicit
  // One replica per device; devices[0] holds the module (it is moved there).
  // Devices may repeat ("cpu" three times: three CPU replicas).
  TORCH_ARG(std::vector<c10::Device>, devices);
  // Where the gathered output lives; devices[0] when unset.
  TORCH_ARG(std::optional<c10::Device>, output_device) = std::nullopt;
  // The dimension the batch is scattered along and the outputs gathered along.
  TORCH_ARG(int64_t, dim) = 0;
};

// The untyped part: replicas as torch::nn::Module, scatter, threads, gather.
class DataParallelBase {
 public:
  std::size_t replica_count() const { return replicas_.size(); }
  // Replica i (0 is the module itself), for inspection.
  const std::shared_ptr<torch::nn::Module>& replica(std::size_t i) const { return replicas_.at(i); }
  // Copies the module's parameters and buffers into the replicas, cloning them again
  // first if the module changed; forward() calls it first (Note [Replicas that stay],
  // Note [Replicas made again]).
  void synchronize();

 protected:
  using MakeClones = std::function<std::vector<std::shared_ptr<torch::nn::Module>>()>;
  // make_clones moves the module to devices[0] and clones it for devices[1..]; it is
  // called again when the module changes (Note [Replicas made again]).
  DataParallelBase(std::shared_ptr<torch::nn::Module> module, MakeClones make_clones, DataParallelOptions options);
  // Scatters `input`, runs forward_one(i, chunk) for each chunk on replica i's thread
  // (with the caller's grad mode and autocast), gathers the outputs.
  at::Tensor run(const at::Tensor& input, const std::function<at::Tensor(std::size_t, const at::Tensor&)>& forward_one);

 private:
  void replicate();
  void link_gradients();
  std::vector<std::string> layout() const;

  std::shared_ptr<torch::nn::Module> primary_;  // the module, replica 0
  MakeClones make_clones_;
  std::vector<std::shared_ptr<torch::nn::Module>> replicas_;
  DataParallelOptions options_;
  std::vector<std::string> layout_;  // the module's tensors when the replicas were made
};

// `ModuleHolder` is a LibTorch module holder (torch::nn::Sequential, or one made by
// TORCH_MODULE) whose Impl derives from torch::nn::Cloneable, so it can be cloned to
// each device (ConfigError otherwise). Single-tensor forward: forward(Tensor) -> Tensor.
template <typename ModuleHolder>
class DataParallel : public DataParallelBase {
  using Impl = typename ModuleHolder::ContainedType;

 public:
  DataParallel(ModuleHolder module, DataParallelOptions options)
      : DataParallelBase(
            module.ptr(), [module, options]() mutable { return clones(module, options); }, options),
        module_(std::move(module)) {}

  at::Tensor forward(const at::Tensor& input) {
    // Replicas are clones of Impl (its Module base is virtual: dynamic_cast).
    return run(input, [this](std::size_t i, const at::Tensor& x) { return dynamic_cast<Impl&>(*replica(i)).forward(x); });
  }
  at::Tensor operator()(const at::Tensor& input) { return forward(input); }

  // The module: its parameters are the ones to optimize and to save.
  ModuleHolder& module() { return module_; }

 private:
  static std::vector<std::shared_ptr<torch::nn::Module>> clones(ModuleHolder& module, const DataParallelOptions& options) {
    if (options.devices().empty())
      throw ConfigError("cohort DataParallel: no devices; give one device per replica (e.g. {cpu, cpu})");
    module->to(options.devices()[0]);
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (std::size_t i = 1; i < options.devices().size(); ++i) {
      try {
        out.push_back(module->clone(options.devices()[i]));
      } catch (const c10::Error& e) {
        throw ConfigError(std::string("cohort DataParallel: cannot clone the module for replica ") +
                          std::to_string(i) + ": " + e.what_without_backtrace() +
                          " (derive its Impl from torch::nn::Cloneable<Impl> and register its submodules in reset())");
      }
    }
    return out;
  }

  ModuleHolder module_;
};

}  // namespace cohort::dp
