#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace cohort::tools {

// `cohort trace merge DIR OUT.json`: one Chrome trace from the ranks' timelines.
// Returns the exit code: 0, 2 for a usage error, 1 when a file cannot be read.
int trace_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace cohort::tools
