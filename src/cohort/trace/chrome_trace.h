#pragma once
// The Chrome trace-event JSON format (the "JSON Object Format" that Perfetto and
// chrome://tracing load): writing one rank's events, and merging the ranks' files
// into one with a process per rank. Pure file I/O; no collectives.
#include <cstddef>
#include <string>
#include <vector>

#include "cohort/trace/timeline.h"

namespace cohort::trace {

struct TraceFileInfo {
  int rank = 0;
  double clock_offset_us = 0;
  std::size_t dropped = 0;
  double overhead_us = 0;
  std::size_t threads = 0;
  std::string device;                 // the device track's device ("cuda:0"); empty: none
  std::size_t device_unfinished = 0;  // device events left out (Timeline::device_unfinished)
};

// Events are written sorted by thread, then start time (an enclosing span before the
// spans it encloses), with the clock offset applied. Throws cohort::Error.
void write_chrome_trace(const std::string& path, const std::vector<Event>& events, const TraceFileInfo& info);

struct MergeResult {
  std::vector<int> ranks;
  std::size_t events = 0;
};

// Reads every rank-<N>.json in `directory` and writes one file holding them all,
// each rank its own process (pid = rank, named "rank N"). Throws cohort::Error naming
// the file when one is missing, unreadable or not a trace.
MergeResult merge_chrome_traces(const std::string& directory, const std::string& out_path);

}  // namespace cohort::trace
