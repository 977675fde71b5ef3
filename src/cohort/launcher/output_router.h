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
// terminal escapes, and so does the last one at the end of the stream); on a console
// that is not a terminal they become ordinary lines, each printed once.
//
// Writes to the console that fail are ignored (a closed console must not stop the
// job). A log that cannot be created or written (a full disk) is reported once per
// router on its report descriptor, the launcher's stderr, and written no more.
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
    std::string log_path;  // with log_fd -1: a log file to create; else log_fd's name
    std::string prefix;   // "[rank3]: "
    bool console_is_tty = false;  // draw status segments in place (Note [Progress lines])
  };

  explicit OutputRouter(int report_fd = 2) : report_fd_(report_fd) {}
  OutputRouter(const OutputRouter&) = delete;
  OutputRouter& operator=(const OutputRouter&) = delete;
  ~OutputRouter();

  // Creates the route's log file when it names one by path.
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
  void emit(Stream& s, const std::string& line, bool to_console = true);
  void emit_status(const Stream& s, const std::string& text);
  void finish_status(Stream& s, const std::string& text);
  void write_log(Stream& s, const std::string& text);
  void log_failed(Stream& s, const char* doing, int err);
  void close(Stream& s);
  std::vector<Stream> streams_;
  int report_fd_;
  bool log_failure_reported_ = false;
  int status_console_ = -1;  // the console whose last output is an open status line
};

}  // namespace cohort::launcher
