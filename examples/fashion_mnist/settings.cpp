#include "settings.h"

#include <fmt/format.h>

namespace fashion_mnist {

// Note [Settings every rank shares]
// What shapes the model, the data each rank reads, the collectives it joins or the
// numbers it computes must be the same on every rank: a rank started with another
// --zero or --pipeline-stages would wait in a collective of another shape until the
// timeout, one with another --seed or --lr would train on to weights no one setting
// gives (the repro of issue 46, item 10). Checkpoints too: every rank loads from its
// --checkpoint-dir, and saves are collective at --checkpoint-every steps. Whether
// --save-final is given must agree (gathering the final state is collective), but
// not its path: rank 0 alone writes it. Left out on purpose, as they may differ:
// --log-interval and --straggler-threshold (rank 0's progress line and report alone
// use them), the path of --save-final, and the path of --data-dir, for which the
// sizes of the data read stand: a node may keep its copy elsewhere. Under
// --fault-tolerance the same list is the replicas' configuration (Note [One
// configuration] in fault_tolerance/replica_group.cpp), with the same exceptions.
std::vector<cohort::comm::Setting> shared_settings(const TrainerOptions& o, std::int64_t train_samples,
                                                   std::int64_t test_samples) {
  auto text = [](const auto& v) { return fmt::format("{}", v); };
  auto flag = [](bool v) { return std::string(v ? "on" : "off"); };
  return {
      {"--epochs", text(o.epochs)},
      {"--batch-size", text(o.batch_size)},
      {"--lr", text(o.lr)},
      {"--optimizer", o.optimizer},
      {"--optimizer-kernel", o.optimizer_kernel},
      {"--cuda-graphs", flag(o.cuda_graphs)},
      {"--schedule", o.schedule},
      {"--seed", text(o.seed)},
      {"--data-dir (training samples read)", text(train_samples)},
      {"--data-dir (test samples read)", text(test_samples)},
      {"--checkpoint-dir", o.checkpoint_dir},
      {"--checkpoint-every", text(o.checkpoint_every)},
      {"--keep-checkpoints", text(o.keep_checkpoints)},
      {"--checkpoint-async", flag(o.checkpoint_async)},
      {"--checkpoint-when-busy", o.checkpoint_when_busy},
      {"--checkpoint-format", o.checkpoint_format},
      {"--save-final (given)", flag(!o.save_final.empty())},
      {"--limit-train-batches", text(o.limit_train_batches)},
      {"--max-steps", text(o.max_steps)},
      {"--device", o.device},
      {"--deterministic", flag(o.deterministic)},
      {"--memory-format", o.memory_format},
      {"--straggler-every", text(o.straggler_every)},
      {"--pipeline-stages", text(o.pipeline_stages)},
      {"--microbatches", text(o.microbatches)},
      {"--pipeline-schedule", o.pipeline_schedule},
      {"--virtual-stages", text(o.virtual_stages)},
      {"--activation-checkpointing", flag(o.activation_checkpointing)},
      {"--amp", o.amp},
      {"--data-parallel-replicas", text(o.data_parallel_replicas)},
      {"--comm-hook", o.comm_hook == "powersgd" ? fmt::format("powersgd:{}", o.powersgd_rank) : o.comm_hook},
      {"--powersgd-start", text(o.powersgd_start)},
      {"--zero", text(o.zero)},
      {"--fault-tolerance", flag(o.fault_tolerance)},
      {"--shards-per-replica", text(o.shards_per_replica)},
  };
}

std::string as_configuration(const std::vector<cohort::comm::Setting>& settings) {
  std::string out;
  for (const auto& [name, value] : settings) out += fmt::format("{}{} {}", out.empty() ? "" : " ", name, value);
  return out;
}

}  // namespace fashion_mnist
