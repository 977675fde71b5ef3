#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace cohort::tools {

// `cohort checkpoint consolidate DIR OUT.pt`: one torch.save file of a checkpoint,
// sharded or whole (checkpoint/consolidate.h). Returns the exit code: 0, 2 for a
// usage error, 1 when the checkpoint cannot be read or OUT.pt written.
int checkpoint_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace cohort::tools
