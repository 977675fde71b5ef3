#pragma once
// The trainer's --comm-hook: how DDP reduces each bucket (allreduce, fp16, bf16, or
// PowerSGD at a rank), and PowerSGD's state in the checkpoints.
#include <memory>
#include <nlohmann/json.hpp>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/comm/group.h"
#include "cohort/ddp/comm_hook.h"
#include "options.h"

namespace fashion_mnist {

class CommHookChoice {
 public:
  explicit CommHookChoice(const TrainerOptions& o);
  // Null for allreduce: DDP's default.
  std::shared_ptr<cohort::ddp::CommHook> hook() const { return hook_; }
  // Collective (PowerSGD gathers every rank's error memory): into the checkpoint.
  void save(cohort::checkpoint::TrainingProgress& progress, cohort::comm::Group& group) const;
  // From a checkpoint; warns when the error memories cannot follow a new world size.
  void restore(const cohort::checkpoint::TrainingProgress& progress, cohort::comm::Group& group) const;
  // For the final JSON: the hook, and PowerSGD's elements per step against plain all-reduce.
  nlohmann::json summary() const;

 private:
  std::string name_;
  std::shared_ptr<cohort::ddp::CommHook> hook_;
};

}  // namespace fashion_mnist
