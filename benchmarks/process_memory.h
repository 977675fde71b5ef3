#pragma once
// This process's resident memory, for the benchmarks' memory reports (Linux /proc).
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace cohort::bench {

// A "VmHWM:" (peak) or "VmRSS:" (now) line of /proc/self/status, in MiB.
inline double status_mb(const std::string& key) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    double kb = 0;
    fields >> kb;
    return kb / 1024;
  }
  throw std::runtime_error("no " + key + " in /proc/self/status");
}

// Resets VmHWM to the current RSS (Linux >= 4.0, see proc(5), clear_refs).
inline bool reset_peak_rss() {
  std::ofstream clear_refs("/proc/self/clear_refs");
  clear_refs << "5";
  clear_refs.flush();
  return static_cast<bool>(clear_refs);
}

}  // namespace cohort::bench
