#include "cohort/util/parse.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "cohort/errors.h"

namespace cohort::util {

long parse_long(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  long value = std::strtol(text.c_str(), &end, 10);
  // strtol skips leading white space; "the whole string" does not.
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || end != text.c_str() + text.size() ||
      errno == ERANGE)
    throw ConfigError(what + ": '" + text + "' is not an integer");
  return value;
}

double parse_seconds(const std::string& text, const std::string& what) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value))
    throw ConfigError(what + ": '" + text + "' is not a number of seconds");
  if (value < 0) throw ConfigError(what + ": '" + text + "' is negative; give seconds >= 0");
  return value;
}

std::chrono::milliseconds timeout_from_seconds(double seconds, const std::string& what) {
  constexpr double kWeek = 7 * 24 * 3600.0;
  if (!(seconds > 0) || !(seconds <= kWeek))
    throw ConfigError(what + ": " + std::to_string(seconds) +
                      " s is not a usable timeout; give seconds > 0 and at most a week (" +
                      std::to_string(static_cast<long>(kWeek)) + ")");
  return std::chrono::milliseconds(static_cast<long long>(std::ceil(seconds * 1000)));
}

}  // namespace cohort::util
