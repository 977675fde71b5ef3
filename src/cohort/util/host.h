#pragma once
#include <string>

namespace cohort::util {

// This machine's host name, as errors and summaries name it.
std::string host_name();

}  // namespace cohort::util
