#include "progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace fashion_mnist {
namespace {

std::string clock_time(double seconds) {
  const auto s = static_cast<long>(std::lround(std::max(0.0, seconds)));
  return s >= 3600 ? fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60)
                   : fmt::format("{}:{:02d}", s / 60, s % 60);
}

// A terminal gets at most this many redraws per second.
constexpr double kRedrawInterval = 0.1;

}  // namespace

std::string format_progress(const ProgressSnapshot& s) {
  const int width = static_cast<int>(std::to_string(s.steps).size());
  return fmt::format("epoch {}/{}  step {:>{}}/{}  loss {:.4f}  {:.0f} samples/s  ETA {}", s.epoch,
                     s.epochs, s.step, width, s.steps, s.loss, s.samples_per_s, clock_time(s.eta_s));
}

Progress::Progress(std::ostream& out, bool interactive, double interval_s)
    : out_(out), interactive_(interactive), interval_s_(interval_s) {}

bool Progress::due(bool force) const {
  const double since = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_).count();
  return force || since >= (interactive_ ? kRedrawInterval : interval_s_);
}

void Progress::show(const ProgressSnapshot& s, bool force) {
  if (!due(force)) return;
  last_ = std::chrono::steady_clock::now();
  if (interactive_) {
    // The line, "erase to the end of the line", then a carriage return, so the next
    // redraw starts at the left edge. Under `cohort run` the '\r' ends the status
    // segment at once (Note [Progress lines]).
    out_ << format_progress(s) << "\x1b[K\r" << std::flush;
    line_open_ = true;
  } else {
    out_ << format_progress(s) << std::endl;
  }
}

void Progress::finish_line() {
  if (line_open_) out_ << std::endl;
  line_open_ = false;
}

bool Progress::stdout_is_interactive() {
  const char* console = std::getenv("COHORT_CONSOLE_TTY");
  return ::isatty(STDOUT_FILENO) == 1 || (console != nullptr && std::strcmp(console, "1") == 0);
}

}  // namespace fashion_mnist
