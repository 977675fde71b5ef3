#pragma once
// Rank 0's progress line: epoch, step/total, loss, samples/s and ETA. On a terminal
// it redraws one line in place; otherwise (a pipe, a log file, `cohort run`'s
// output) it prints a plain line every few seconds, so logs stay readable.
#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

namespace fashion_mnist {

struct ProgressSnapshot {
  int epoch = 0;  // 1-based, for people
  int epochs = 0;
  std::int64_t step = 0;  // in this epoch, 1-based
  std::int64_t steps = 0;
  double loss = 0;
  double samples_per_s = 0;
  double eta_s = 0;
};

std::string format_progress(const ProgressSnapshot& s);

class Progress {
 public:
  // `interactive`: redraw in place (a terminal). `interval_s`: seconds between plain lines.
  Progress(std::ostream& out, bool interactive, double interval_s);
  // Whether show(s, force) would print now: the caller reads what it shows (the
  // loss, from the device) only then.
  bool due(bool force = false) const;
  // Shows `s` if enough time has passed since the last line, or if `force`.
  void show(const ProgressSnapshot& s, bool force = false);
  // Ends the in-place line, before other output.
  void finish_line();

  // Whether this process's standard output is a terminal, or the launcher says its
  // console is one (COHORT_CONSOLE_TTY=1).
  static bool stdout_is_interactive();

 private:
  std::ostream& out_;
  bool interactive_;
  double interval_s_;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace fashion_mnist
