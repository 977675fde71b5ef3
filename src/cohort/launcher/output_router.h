#pragma once
// Carries worker output to the console and to log files, one whole line at a time,
// each console line prefixed "[rank<N>]: ". Every line is written with a single
// write(2), so lines from different workers never interleave mid-line.
//
// Note [Progress lines]: a worker whose console is a terminal (the launcher tells it
// with COHORT_CONSOLE_TTY=1, since its own stdout is a pipe) may redraw a progress
// line with '\r'. Such status segments are drawn in place on a terminal console, and
// a whole line from any worker, on stdout or stderr, first clears the status line and
// then takes its place, so the status reappears below it at its next redraw. Status
// segments never reach log files (a finished progress line does, without its
// terminal escapes); on a console that is not a terminal they become ordinary lines.
#include <string>
#include <vector>

#include "cohort/launcher/line_splitter.h"

namespace cohort::launcher {

class OutputRouter {
 public:
  struct Route {
    int source_fd = -1;   // the worker's end of the pipe, read by the agent
    int console_fd = -1;  // 1 or 2, or -1 to hide from the console
    int log_fd = -1;      // an open log file, or -1
    std::string prefix;   // "[rank3]: "
    bool console_is_tty = false;  // draw status segments in place (Note [Progress lines])
  };

  OutputRouter() = default;
  OutputRouter(const OutputRouter&) = delete;
  OutputRouter& operator=(const OutputRouter&) = delete;
  ~OutputRouter();

  void add(Route route);
  // Reads what is available on `fd`; closes it at end of stream. Returns false if
  // `fd` is not one of ours.
  bool pump(int fd);
  // Flushes partial lines and closes every source (for pipes kept open by a
  // grandchild after its worker exited).
  void close_all();
  std::vector<int> open_fds() const;

 private:
  struct Stream {
    Route route;
    LineSplitter splitter;
    bool open = true;
  };
  void emit(const Stream& s, const std::string& line);
  void emit_status(const Stream& s, const std::string& text);
  void close(Stream& s);
  std::vector<Stream> streams_;
  int status_console_ = -1;  // the console whose last output is an open status line
};

}  // namespace cohort::launcher
