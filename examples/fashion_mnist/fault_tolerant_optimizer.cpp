#include "fault_tolerant_optimizer.h"

#include <torch/optim.h>

#include "cohort/fault_tolerance/training_state.h"
#include "optimizer.h"

namespace fashion_mnist {

namespace ft = cohort::fault_tolerance;

FaultTolerantOptimizer::FaultTolerantOptimizer(const TrainerOptions& o, FashionNet model)
    : model_(std::move(model)), zero_(o.zero) {
  if (zero_ == 0) {
    whole_ = make_local_optimizer(o.optimizer, o.optimizer_kernel, o.lr, model_->parameters());
    return;
  }
  sharded_ = std::make_unique<ft::ReplicaShardedOptimizer>(
      model_->parameters(),
      [o](std::vector<at::Tensor> shard) {
        return make_local_optimizer(o.optimizer, o.optimizer_kernel, o.lr, std::move(shard));
      },
      cohort::zero::ShardedOptimizerOptions().shard_gradients(zero_ == 2));
}

void FaultTolerantOptimizer::save_state(std::ostream& out) const {
  if (sharded_) return ft::save_training_state(out, *model_, *sharded_);
  ft::save_training_state(out, *model_, whole_.get());
}

void FaultTolerantOptimizer::load_state(std::istream& in) {
  if (sharded_) return ft::load_training_state(in, *model_, *sharded_);
  ft::load_training_state(in, *model_, whole_.get());
}

void FaultTolerantOptimizer::on_quorum(const ft::Quorum& q) {
  ddp_.reset();  // its hooks go before the new DDP adds its own
  if (sharded_) sharded_->on_quorum(q);
  if (zero_ < 2) ddp_ = std::make_unique<cohort::ddp::DistributedDataParallel<FashionNet>>(model_, q.group);
}

at::Tensor FaultTolerantOptimizer::forward(const at::Tensor& x) { return ddp_ ? (*ddp_)(x) : model_->forward(x); }

void FaultTolerantOptimizer::zero_grad() {
  if (sharded_) return sharded_->zero_grad();
  whole_->zero_grad();
}

bool FaultTolerantOptimizer::after_backward(const ft::Quorum& q, bool ok) {
  return sharded_ ? sharded_->average_over_replicas(q, ok) : ok;
}

void FaultTolerantOptimizer::set_lr(double lr) { optimizer().param_groups()[0].options().set_lr(lr); }

bool FaultTolerantOptimizer::step(ft::ReplicaGroup& replicas) {
  if (sharded_) return sharded_->step(replicas);
  whole_->step();
  return true;
}

torch::optim::Optimizer& FaultTolerantOptimizer::optimizer() {
  if (sharded_) return sharded_->optimizer();
  return *whole_;
}

std::unique_ptr<cohort::checkpoint::Checkpointer> FaultTolerantOptimizer::checkpointer(const std::string& dir, int keep,
                                                                                       const ft::Quorum& q) const {
  return std::make_unique<cohort::checkpoint::Checkpointer>(dir, sharded_ ? q.shard_group : q.group,
                                                           cohort::checkpoint::CheckpointerOptions().keep_last(keep));
}

bool FaultTolerantOptimizer::writes_checkpoints(const ft::Quorum& q) const {
  return !sharded_ || q.rank < q.size / q.replicas;  // the quorum's first replica
}

}  // namespace fashion_mnist
