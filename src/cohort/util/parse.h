#pragma once
// Strict number parsing for environment variables and flags: the whole string must
// be a number, and the error names what was being parsed.
#include <chrono>
#include <string>

namespace cohort::util {

// Throws ConfigError("<what>: '<text>' is not an integer") on any junk before or
// after the digits (white space included).
long parse_long(const std::string& text, const std::string& what);

// Seconds, integer or decimal ("2", "0.5"); negative values are rejected.
double parse_seconds(const std::string& text, const std::string& what);

// A timeout in seconds as a bounded duration: it must be > 0 and at most a week,
// because c10d reads 0 ms as "no timeout at all". Rounds up to whole milliseconds.
std::chrono::milliseconds timeout_from_seconds(double seconds, const std::string& what);

}  // namespace cohort::util
