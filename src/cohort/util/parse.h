#pragma once
// Strict number parsing for environment variables and flags: the whole string must
// be a number, and the error names what was being parsed.
#include <string>

namespace cohort::util {

// Throws ConfigError("<what>: '<text>' is not an integer") on any trailing junk.
long parse_long(const std::string& text, const std::string& what);

// Seconds, integer or decimal ("2", "0.5"); negative values are rejected.
double parse_seconds(const std::string& text, const std::string& what);

}  // namespace cohort::util
