#pragma once
// DistributedDataParallel: data-parallel training across processes. Each rank holds
// a full replica of the model and a different slice of the data; during backward,
// gradients are averaged across ranks in buckets, overlapped with the rest of
// backward, so every replica takes the same optimizer step.
//
//   auto world = cohort::comm::World::init();
//   auto model = Net();                                   // any torch::nn::Module
//   cohort::ddp::DistributedDataParallel ddp(model, world.group());
//   torch::optim::SGD opt(ddp.module()->parameters(), 0.1);
//   for (auto& batch : my_shard) {
//     auto loss = torch::nll_loss(ddp(batch.data), batch.target);
//     loss.backward();                                    // gradients averaged here
//     opt.step();
//     opt.zero_grad();
//   }
//
// Design decision: how forward is called. LibTorch modules have no virtual forward
// (each declares its own signature), so DistributedDataParallel<ModuleType> is a
// template over the module holder: ddp.forward(args...) / ddp(args...) forwards any
// arguments to module->forward and returns exactly its result type. Around that call
// it runs before_forward (closing a step whose backward failed, device check, join
// round, bucket rebuild, buffer broadcast when due) and after_forward (arms the
// gradient hooks; walks the graph for unused parameters). Tensors are found in the
// arguments and the result as tensor_visit.h describes; a result type it does not
// know is a compile-time error.
// Those two are public on DistributedDataParallelBase, the non-template part, for
// code that cannot route its forward through the wrapper (a module called through
// several methods, or a loss computed by sub-modules directly): call them yourself.
// Python's `.module` is module().
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <optional>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cohort/comm/group.h"
#include "cohort/ddp/join.h"
#include "cohort/ddp/options.h"
#include "cohort/ddp/reducer.h"
#include "cohort/ddp/tensor_visit.h"

namespace cohort::ddp {

class DistributedDataParallelBase {
 public:
  // Collective: checks that every rank wraps the same parameters (ConfigError on
  // every rank otherwise), then broadcasts parameters and buffers from rank 0.
  DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module, comm::Group group,
                              DistributedDataParallelOptions options = DistributedDataParallelOptions());
  virtual ~DistributedDataParallelBase();
  DistributedDataParallelBase(DistributedDataParallelBase&&) = default;
  DistributedDataParallelBase& operator=(DistributedDataParallelBase&&) = default;

  // Call on every rank around each forward of the wrapped module, when not using
  // DistributedDataParallel<M>::forward. `inputs` are checked to be on the model's
  // device; `outputs` are where the graph walk for unused parameters starts.
  //
  // Note [When buffers are synchronised]
  // With broadcast_buffers, rank 0's buffers (BatchNorm's running statistics) are
  // broadcast before the first forward that follows a synchronised training
  // forward (grad enabled, outside no_sync), and before the very first forward;
  // not before the forwards after it, as in PyTorch 1.13. So the evaluation that
  // follows a training step starts from rank 0's buffers, and ranks may then run
  // different numbers of evaluation (no_grad) forwards: every rank has had one
  // training forward before, so every rank broadcasts exactly once.
  void before_forward(const std::vector<at::Tensor>& inputs);
  void after_forward(const std::vector<at::Tensor>& outputs);

  // Gradient accumulation: backward passes that follow forwards run under this guard
  // only accumulate into .grad; the first step after it reduces the sum.
  //   { auto guard = ddp.no_sync(); for (micro-batches but the last) { fwd; bwd; } }
  //   fwd; bwd;  opt.step();
  class [[nodiscard]] NoSync {
   public:
    explicit NoSync(DistributedDataParallelBase& ddp) : ddp_(ddp), previous_(ddp.require_sync_) {
      ddp.require_sync_ = false;
    }
    ~NoSync() { ddp_.require_sync_ = previous_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallelBase& ddp_;
    bool previous_;
  };
  // Discarding the guard would end it at once: `ddp.no_sync();` does nothing.
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  // Runs `loop` (this rank's training loop) under Note [Join]. Every rank calls it.
  void join(const std::function<void()>& loop, JoinOptions options = JoinOptions());

  comm::Group& group() { return group_; }
  const DistributedDataParallelOptions& options() const { return options_; }
  const torch::nn::Module& wrapped() const { return *module_; }
  const Reducer& reducer() const { return *reducer_; }
  // Per-bucket timings of the last synchronised backward (record_timings(true)).
  const IterationTimings& last_timings() const { return reducer_->last_timings(); }

 private:
  void check_input_devices(const std::vector<at::Tensor>& inputs) const;
  // Note [The trainable set is fixed at construction]
  void check_trainable_set();
  JoinRound join_round(bool active, bool grad_enabled, bool sync, bool sync_buffers);
  void shadow_until_all_joined();

  std::shared_ptr<torch::nn::Module> module_;
  comm::Group group_;
  DistributedDataParallelOptions options_;
  std::unique_ptr<Reducer> reducer_;
  std::vector<at::Tensor> buffers_;
  std::optional<c10::Device> device_;  // set when every parameter lives on one device
  // Note [The trainable set is fixed at construction]
  std::unordered_set<const void*> constructed_with_;  // every parameter's TensorImpl
  std::unordered_set<const void*> reduced_;           // those DDP reduces
  std::vector<std::pair<const void*, bool>> last_seen_;  // (TensorImpl, requires_grad), in order
  bool require_sync_ = true;
  bool buffers_due_ = true;  // Note [When buffers are synchronised]
  double divisor_ = 1;

  struct JoinState {
    bool active = false;
    JoinOptions options;
    std::optional<JoinRound> last_round;
  } join_;
};

namespace detail {
template <typename T>
std::shared_ptr<torch::nn::Module> module_ptr(const torch::nn::ModuleHolder<T>& holder) {
  return holder.ptr();
}
template <typename T>
std::shared_ptr<torch::nn::Module> module_ptr(const std::shared_ptr<T>& module) {
  return module;
}
}  // namespace detail

// ModuleType is a module holder (torch::nn::Linear, a TORCH_MODULE of yours) or a
// std::shared_ptr to a module.
template <typename ModuleType>
class DistributedDataParallel : public DistributedDataParallelBase {
 public:
  DistributedDataParallel(ModuleType module, comm::Group group,
                          DistributedDataParallelOptions options = DistributedDataParallelOptions())
      : DistributedDataParallelBase(detail::module_ptr(module), std::move(group), std::move(options)),
        module_(std::move(module)) {}

  template <typename... Args>
  auto forward(Args&&... args) {
    before_forward(tensors_in(args...));
    auto output = module_->forward(std::forward<Args>(args)...);
    after_forward(tensors_in_result(output));
    return output;
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // The wrapped module (Python's ddp.module): for parameters(), train()/eval(),
  // saving, and calling other methods.
  ModuleType& module() { return module_; }
  const ModuleType& module() const { return module_; }

 private:
  ModuleType module_;
};

}  // namespace cohort::ddp
