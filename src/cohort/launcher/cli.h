#pragma once
// `cohort run`'s command line, spelled as torchrun spells it (dashes or underscores).
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cohort/launcher/run_options.h"

namespace cohort::launcher {

// Parses the arguments after `run`. Returns nullopt after printing help to `out`
// for --help. Throws UsageError for anything wrong, naming the flag.
std::optional<RunOptions> parse_run_command(const std::vector<std::string>& args, std::ostream& out);

}  // namespace cohort::launcher
