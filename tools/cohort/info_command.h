#pragma once
#include <ostream>

namespace cohort::tools {

// `cohort info [--json]`: LibTorch version, backends compiled in, devices seen.
int info_command(bool json, std::ostream& out);

}  // namespace cohort::tools
