#pragma once
// `cohort checkpoint convert SRC OUT --to dcp`: a cohort checkpoint (whole, sharded
// or of a tensor-parallel model: all hold whole tensors once consolidated) as a
// PyTorch distributed checkpoint that torch.distributed.checkpoint.load reads into
// the state dict of get_state_dict(model, optimizer) at any world size:
//
//   model.<name>                        the model's parameters and buffers
//   optim.state.<name>.<field>          exp_avg, exp_avg_sq, step (a 0-d float32 tensor,
//                                       as PyTorch keeps it), momentum_buffer
//   optim.param_groups.<g>.<option>     PyTorch 2.11's options of that optimizer, the
//                                       ones LibTorch has not taken at their defaults;
//                                       params: the parameters' names
//   train.step, train.epoch
//
// Parameter i of the optimizer is the model's i-th entry, as cohort saves them
// (parameters before buffers). docs/checkpoints.md#pytorchs-distributed-checkpoints.
#include <ATen/core/Dict.h>

#include <ostream>
#include <string>

#include "cohort/checkpoint/consolidate.h"
#include "cohort/checkpoint/dcp/writer.h"

namespace cohort::checkpoint::dcp {

struct Converted {
  Consolidated source;    // what was read
  Written written;        // what was written
  std::string optimizer;  // adam | adamw | sgd
};

// `optimizer` is adam, adamw or sgd: which PyTorch optimizer the state is for; empty
// infers sgd from its options, and asks (a cohort::ConfigError) for Adam's two
// kinds, whose LibTorch files look alike. Throws cohort::DataError for an unreadable
// checkpoint, cohort::ConfigError for an optimizer of another kind; nothing is
// written then.
Converted convert_to_dcp(const std::string& source, const std::string& out, const std::string& optimizer,
                         std::ostream& log);

// The entries convert_to_dcp writes, of a consolidated state ({"model", "optimizer",
// "step", "epoch"}: consolidate_internal.h); `optimizer` as above, the kind taken is
// put in `chosen`. Format::kDcp writes these too.
std::vector<Entry> entries_of_state(const c10::impl::GenericDict& state, const std::string& optimizer,
                                    const std::string& source, std::string& chosen);

}  // namespace cohort::checkpoint::dcp
