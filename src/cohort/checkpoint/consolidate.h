#pragma once
// One file of a checkpoint, for Python and for tools that know nothing of shards:
// `cohort checkpoint consolidate DIR OUT.pt`. OUT.pt is written in torch.save's
// format (Note [Untagged pickles]), so that
//
//   state = torch.load("OUT.pt", weights_only=True)
//   state["model"]       # the model's state dict, as model.pt holds it
//   state["optimizer"]   # {"state": {i: {"exp_avg": ..., "step": ...}},
//                        #  "param_groups": [{"lr": ..., ..., "params": [0, 1, ...]}]}
//   state["step"], state["epoch"]
//
// Parameter i is the optimizer's i-th parameter (the model's parameters() in order,
// each once), as in PyTorch's own optimizer state_dict. The fields are LibTorch's
// names, which for SGD and Adam(W) are PyTorch's (Adam's "step" is an int here).
// A whole checkpoint (optimizer.pt) consolidates the same way.
#include <cstdint>
#include <ostream>
#include <string>

namespace cohort::checkpoint {

struct Consolidated {
  std::string checkpoint;  // the step directory that was read
  std::int64_t step = 0;
  int shards = 0;               // optimizer files read (1 for a whole checkpoint)
  std::int64_t parameters = 0;  // the optimizer's parameters
  std::int64_t with_state = 0;  // those with a state
  std::uint64_t bytes = 0;      // of the file written
};

// `source` is a checkpoint directory (step-N, with a MANIFEST.json) or a directory of
// them, whose newest complete checkpoint is taken (older ones when newer ones fail
// their checksums, with a line on `log` naming the file). Reads one optimizer file
// at a time; holds the consolidated state and its bytes in memory while writing
// `out` atomically (Note [Atomic replace]). Throws cohort::DataError naming the file
// for a missing, corrupt or unreadable one; nothing is written then.
Consolidated consolidate_checkpoint(const std::string& source, const std::string& out, std::ostream& log);

}  // namespace cohort::checkpoint
