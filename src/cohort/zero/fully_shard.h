#pragma once
// ZeRO stage 3, FSDP-style parameter sharding: each rank keeps 1/N of every
// parameter, gathers a unit's parameters just before the unit computes, and frees
// them after (Rajbhandari et al., 2020; PyTorch's FSDP and fully_shard).
//
// LibTorch modules have no forward hooks, so a unit is a wrapper module: declare
// the sub-modules to shard as cohort::zero::FullyShard<Impl>, bottom-up, wrap the
// whole model too, then call fully_shard() once on every rank:
//
//   struct NetImpl : torch::nn::Module {
//     NetImpl() {
//       for (int i = 0; i < 4; ++i)
//         blocks.push_back(register_module("block" + std::to_string(i),
//                                          cohort::zero::FullyShard<BlockImpl>(Block(512))));
//       head = register_module("head", torch::nn::Linear(512, 10));  // in the outer unit
//     }
//     ...
//   };
//   cohort::zero::FullyShard<NetImpl> net(std::make_shared<NetImpl>());
//   auto sharded = cohort::zero::fully_shard(net, world.group());       // collective
//   torch::optim::Adam optimizer(sharded.parameters(), 1e-3);            // the shards
//   for (...) { optimizer.zero_grad(); loss(net(x)).backward(); optimizer.step(); }
//
// A wrapper is transparent: it registers the wrapped module's parameters, buffers
// and children under their own names, so net->named_parameters() and state dicts
// read exactly as the unwrapped model's. Each unit owns the parameters under it that
// no inner unit owns; a parameter shared by two units belongs to the innermost unit
// that contains both. Their values are flattened and sharded (Note [Flat parameters]
// in zero/flat_parameter.h); when and how they are gathered, freed and reduced is
// Note [ZeRO-3 schedule] in zero/shard_schedule.h.
//
// Between steps the original parameters hold no data (Note [Freeing in place]): the
// optimizer steps sharded.parameters(), and a state dict is read or written inside
// sharded.full_parameters(). Move the model to its device before fully_shard().
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cohort/comm/group.h"
#include "cohort/zero/fully_shard_options.h"
#include "cohort/zero/shard_schedule.h"

namespace cohort::zero {

// What every FullyShard<Impl> is; fully_shard() finds the units by this type.
class ShardedUnitBase : public torch::nn::Module {
 public:
  void train(bool on = true) override;
  void pretty_print(std::ostream& stream) const override;
  const std::shared_ptr<torch::nn::Module>& wrapped() const { return inner_; }
  // By fully_shard().
  void attach(std::shared_ptr<ShardSchedule> schedule, std::size_t index);
  bool attached() const { return schedule_ != nullptr; }

 protected:
  explicit ShardedUnitBase(std::shared_ptr<torch::nn::Module> inner);

  // Runs the wrapped forward between the schedule's calls (Note [ZeRO-3 schedule]).
  template <typename Body>
  auto run(Body&& body) -> decltype(body()) {
    if (!schedule_) return body();  // not sharded yet: a plain module
    schedule_->pre_forward(index_);
    auto out = body();
    using Out = std::decay_t<decltype(out)>;
    // An output that is a view of the unit's own parameter (a learned embedding
    // returned as is) would read freed memory once the unit is freed: a copy.
    if constexpr (std::is_same_v<Out, at::Tensor>) {
      if (schedule_->aliases(index_, out)) out = out.clone();
      schedule_->post_forward(index_, {out}, false);
    } else if constexpr (std::is_same_v<Out, std::vector<at::Tensor>>) {
      for (auto& t : out)
        if (schedule_->aliases(index_, t)) t = t.clone();
      schedule_->post_forward(index_, out, false);
    } else {
      schedule_->post_forward(index_, {}, true);
    }
    return out;
  }
  // Mixed precision: floating-point tensor inputs in param_dtype.
  template <typename A>
  decltype(auto) cast_input(A&& a) const {
    if constexpr (std::is_same_v<std::decay_t<A>, at::Tensor>) {
      return cast_tensor(a);
    } else {
      return std::forward<A>(a);
    }
  }
  at::Tensor cast_tensor(const at::Tensor& t) const;

 private:
  std::shared_ptr<torch::nn::Module> inner_;
  std::shared_ptr<ShardSchedule> schedule_;
  std::size_t index_ = 0;
};

template <typename Impl>
class FullyShardImpl : public ShardedUnitBase {
 public:
  explicit FullyShardImpl(std::shared_ptr<Impl> inner) : ShardedUnitBase(inner), typed_(std::move(inner)) {}
  explicit FullyShardImpl(const torch::nn::ModuleHolder<Impl>& inner) : FullyShardImpl(inner.ptr()) {}

  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    return run([&]() -> decltype(auto) { return typed_->forward(cast_input(std::forward<Args>(args))...); });
  }
  // The wrapped module, for its other methods.
  const std::shared_ptr<Impl>& module() const { return typed_; }

 private:
  std::shared_ptr<Impl> typed_;
};

// A holder, as TORCH_MODULE makes: FullyShard<torch::nn::LinearImpl>(torch::nn::Linear(4, 8)),
// or a member declared FullyShard<BlockImpl> block{nullptr}.
template <typename Impl>
class FullyShard : public torch::nn::ModuleHolder<FullyShardImpl<Impl>> {
 public:
  using torch::nn::ModuleHolder<FullyShardImpl<Impl>>::ModuleHolder;
  // ModuleHolder's own operator() cannot see a template forward().
  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    return this->get()->forward(std::forward<Args>(args)...);
  }
};

// What fully_shard() returns: a handle (copies share the state) to what the units
// share. Keep it, or a copy, as long as the model trains.
class FullyShardedModel {
 public:
  explicit FullyShardedModel(std::shared_ptr<ShardSchedule> schedule) : schedule_(std::move(schedule)) {}

  // This rank's shards of the trainable parameters, one flat tensor per unit and
  // dtype, in the same order on every rank: give these to the optimizer.
  std::vector<at::Tensor> parameters() const;

  // While the guard lives, backward sums each unit's gradients locally at full size
  // and sends nothing; the next synchronised backward sends the sum. Enter it before
  // the forward.
  class NoSync {
   public:
    explicit NoSync(ShardSchedule& schedule);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    ShardSchedule& schedule_;
  };
  [[nodiscard]] NoSync no_sync();

  // Collective, between steps: while the guard lives every original parameter holds
  // its whole value in its own dtype, on every rank, so that state dicts and
  // checkpoints read (and, with write_back, write) the model as if it were not
  // sharded. With write_back, leaving copies each rank's chunk back into its shards:
  // all of them, or none when a parameter was given another size (a file of another
  // model). close() leaves at once and throws ConfigError for that; the destructor
  // closes too, but never throws: it prints the error and the next forward, step or
  // full_parameters() throws it (Note [Leaving full_parameters()]).
  class FullParameters {
   public:
    FullParameters(ShardSchedule& schedule, bool write_back);
    ~FullParameters();
    FullParameters(const FullParameters&) = delete;
    FullParameters& operator=(const FullParameters&) = delete;
    void close();

   private:
    ShardSchedule& schedule_;
    bool write_back_;
    bool closed_ = false;
  };
  [[nodiscard]] FullParameters full_parameters(bool write_back = false);

  // Collective: scales the sharded gradients so that the whole model's 2-norm is at
  // most max_norm, as torch::nn::utils::clip_grad_norm_ over the unsharded model
  // would; returns the total norm, the same on every rank.
  double clip_grad_norm(double max_norm);

  // Bytes this rank holds now: the shards plus any gathered units; the sharded
  // gradients.
  std::int64_t local_parameter_bytes() const;
  std::int64_t local_gradient_bytes() const;
  // The parameters' elements in the whole model (each shared one once).
  std::int64_t total_parameters() const;

  ShardSchedule& schedule() const { return *schedule_; }

 private:
  std::shared_ptr<ShardSchedule> schedule_;
};

// Collective: shards `root` and every FullyShard unit inside it. Broadcasts rank
// 0's parameters and buffers first, as DDP does. Throws ConfigError on every rank
// when the ranks' models or options differ (check_replicas), and for parameters on
// several devices or shared across units that do not nest.
FullyShardedModel fully_shard(const std::shared_ptr<ShardedUnitBase>& root, comm::Group group,
                              FullyShardOptions options = FullyShardOptions());

template <typename Impl>
FullyShardedModel fully_shard(const FullyShard<Impl>& root, comm::Group group,
                              FullyShardOptions options = FullyShardOptions()) {
  return fully_shard(std::static_pointer_cast<ShardedUnitBase>(root.ptr()), std::move(group), std::move(options));
}

}  // namespace cohort::zero
