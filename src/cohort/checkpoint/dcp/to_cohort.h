#pragma once
// A distributed checkpoint's state (reader.h) in cohort's whole form: what model.pt and
// optimizer.pt of a cohort checkpoint hold, so that Checkpointer::load_latest loads it
// as it loads its own, resharding to any world size, ZeRO stage or tensor-parallel
// size there (Note [Checkpoints hold whole tensors]).
//
// The keys are those of {"model": ..., "optim": ...} from PyTorch's
// get_state_dict(model, optimizer), as torchtitan and dcp's tutorials save them, and
// as `cohort checkpoint convert --to dcp` and Format::kDcp write them:
//   model.<name>                       the state dict (DDP's `module.` prefix removed)
//   optim.state.<name>.<field>         Adam(W): step, exp_avg, exp_avg_sq, max_exp_avg_sq;
//                                      SGD: momentum_buffer
//   optim.param_groups.<g>.<option>    lr, betas, eps, weight_decay, amsgrad, momentum, ...;
//                                      params: the parameters' names
//   train.step, train.epoch (or step, epoch at the top)
// Other keys (a scheduler's, a dataloader's) are listed in `ignored`.
#include <ATen/core/Dict.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cohort/checkpoint/dcp/writer.h"

namespace cohort::checkpoint::dcp {

struct CohortState {
  c10::impl::GenericDict model{c10::StringType::get(), c10::TensorType::get()};  // name -> tensor
  std::string optimizer;        // adam | adamw | sgd; empty when the checkpoint holds no optimizer
  std::string optimizer_bytes;  // LibTorch's serialized state of that optimizer (optimizer.pt)
  std::int64_t parameters_with_state = 0;
  std::optional<std::int64_t> step, epoch;
  std::vector<std::string> ignored;
};

// Throws cohort::DataError naming `source` for state that cannot be (a parameter
// group naming a parameter the model lacks, a moment of another shape than its
// parameter), cohort::ConfigError for an optimizer other than Adam, AdamW and SGD, or
// parameter groups that list parameter numbers instead of names (a state saved with
// optimizer.state_dict() instead of get_state_dict).
CohortState to_cohort(const std::vector<Entry>& entries, const std::string& source);

}  // namespace cohort::checkpoint::dcp
