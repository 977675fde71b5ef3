#pragma once
#include <ostream>
#include <string>

namespace cohort::tools {

// `cohort checkpoint inspect DIR`: prints what the checkpoint DIR (or, for a
// directory of them, each one's kind and state, then the newest) holds: in cohort's
// format its files, step, optimizer layout and tensors; in PyTorch's distributed
// checkpoint format its data files, every tensor's dtype, shape and chunks, and every
// plain value. Returns 0, or 1 naming what cannot be read.
int inspect_checkpoint(const std::string& dir, std::ostream& out, std::ostream& err);

}  // namespace cohort::tools
