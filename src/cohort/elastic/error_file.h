#pragma once
// The worker side of torchelastic's error reporting. A launcher (cohort run or
// torchrun) gives each worker a path in TORCHELASTIC_ERROR_FILE; a worker that dies
// of an uncaught exception writes the reason there, and the launcher names it in its
// failure summary. The JSON layout is torchelastic's own, so torchrun reads ours:
//
//   {"message": {"message": "<type>: <what>",
//                "extraInfo": {"py_callstack": "<detail>", "timestamp": "<unix s>"}}}
//
//   int main(int argc, char** argv) {
//     return cohort::elastic::record([&] { return train(argc, argv); });
//   }
#include <cstddef>
#include <functional>
#include <optional>
#include <string>

namespace cohort::elastic {

struct ErrorRecord {
  std::string message;  // "<type>: <what>"
  std::string detail;   // extraInfo.py_callstack
  long timestamp = 0;   // seconds since the epoch
};

// Runs `body`. If it throws, writes the error file (when TORCHELASTIC_ERROR_FILE is
// set), prints the error to stderr and returns 1; otherwise returns body's result.
int record(const std::function<int()>& body);

// Writes `record` to `path` (atomically: temp file, then rename). Returns false if it
// could not be written; never throws.
bool write_error_file(const std::string& path, const ErrorRecord& record);

// The most of an error file the launcher reads, and how much of a bigger one its
// message shows (Note [Bounded error files] in error_file.cpp).
inline constexpr std::size_t kMaxErrorFileBytes = std::size_t{1} << 20;
inline constexpr std::size_t kTruncatedPrefixBytes = 4096;

// Reads a torchelastic error file. nullopt if absent; a file that is not the
// expected JSON yields its raw text as the message; one over kMaxErrorFileBytes is
// not parsed: its message says it was truncated and shows its beginning.
std::optional<ErrorRecord> read_error_file(const std::string& path);

std::string to_json(const ErrorRecord& record);

}  // namespace cohort::elastic
