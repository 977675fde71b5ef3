#pragma once
// Turns a byte stream into whole lines, so that the launcher can prefix each line
// with its rank and write it in one piece. Pure: no file descriptors.
#include <cstddef>
#include <functional>
#include <string>

namespace cohort::launcher {

class LineSplitter {
 public:
  // A line longer than this is emitted in pieces of this size.
  static constexpr std::size_t kMaxLine = 64 * 1024;
  using Emit = std::function<void(const std::string& line)>;  // without the '\n'

  // With `status`, a carriage return ends a status segment (a progress line that a
  // terminal redraws in place), passed to `status` without the '\r'; empty segments
  // are dropped. A '\n' right after a status ("...\r\n", or a progress line that is
  // done) finishes that status: it is passed to `done`, or when there is no `done`
  // emitted again as a whole line, so it stays on the console and reaches the log.
  // Without `status`, '\r' is an ordinary character.
  void feed(const char* data, std::size_t size, const Emit& emit, const Emit& status = nullptr,
            const Emit& done = nullptr);
  // End of stream: emits a last line that had no newline, or finishes a last status
  // segment (to `done`, else to `emit`), so that text ended by '\r' is not lost.
  void finish(const Emit& emit, const Emit& done = nullptr);

 private:
  std::string pending_;
  std::string last_status_;
  bool after_status_ = false;  // nothing but '\r' since the last status segment
};

}  // namespace cohort::launcher
