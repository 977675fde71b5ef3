#include "cohort/launcher/output_router.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace cohort::launcher {
namespace {

// Returns 0, or the errno of the write that failed.
int write_all(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

// "Erase to the end of the line", which progress lines carry for terminals only.
std::string without_erase(std::string line) {
  static const std::string kErase = "\x1b[K";
  for (auto at = line.find(kErase); at != std::string::npos; at = line.find(kErase, at)) line.erase(at, kErase.size());
  return line;
}

}  // namespace

OutputRouter::~OutputRouter() { close_all(); }

void OutputRouter::add(Route route) {
  Stream s;
  s.route = std::move(route);
  if (s.route.log_fd < 0 && !s.route.log_path.empty()) {
    s.route.log_fd = ::open(s.route.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (s.route.log_fd < 0) log_failed(s, "create", errno);
  }
  streams_.push_back(std::move(s));
}

void OutputRouter::log_failed(Stream& s, const char* doing, int err) {
  if (s.route.log_fd >= 0) ::close(s.route.log_fd);
  s.route.log_fd = -1;
  if (log_failure_reported_) return;
  log_failure_reported_ = true;
  write_all(report_fd_,
            fmt::format("cohort run: error: could not {} the worker log {}: {}; what the worker prints there from "
                        "now on is lost, and other logs may be incomplete too (reported once)\n  fix: make room on "
                        "the log folder's disk, or pass a --log-dir on a disk with space\n",
                        doing, s.route.log_path.empty() ? "(unnamed)" : s.route.log_path, std::strerror(err)));
}

void OutputRouter::write_log(Stream& s, const std::string& text) {
  if (s.route.log_fd < 0) return;
  if (int err = write_all(s.route.log_fd, without_erase(text) + "\n")) log_failed(s, "write", err);
}

void OutputRouter::emit(Stream& s, const std::string& line, bool to_console) {
  if (s.route.console_fd >= 0 && to_console) {
    // "\r" then "erase line" clears an open status line, wherever it is drawn: stdout
    // and stderr usually share the terminal (Note [Progress lines]).
    if (status_console_ >= 0) {
      write_all(status_console_, "\r\x1b[K");
      status_console_ = -1;
    }
    write_all(s.route.console_fd, s.route.prefix + line + "\n");
  }
  write_log(s, line);
}

void OutputRouter::emit_status(const Stream& s, const std::string& text) {
  if (s.route.console_fd < 0) return;
  if (!s.route.console_is_tty) {
    write_all(s.route.console_fd, s.route.prefix + text + "\n");
    return;
  }
  write_all(s.route.console_fd, "\r" + s.route.prefix + text);
  status_console_ = s.route.console_fd;
}

// A status segment that a '\n' or the end of the stream made final: a terminal
// keeps it as a line, a plain console has printed it already, a log gets it now.
void OutputRouter::finish_status(Stream& s, const std::string& text) { emit(s, text, s.route.console_is_tty); }

void OutputRouter::close(Stream& s) {
  if (!s.open) return;
  s.splitter.finish([&](const std::string& line) { emit(s, line); },
                    [&](const std::string& text) { finish_status(s, text); });
  ::close(s.route.source_fd);
  if (s.route.log_fd >= 0) ::close(s.route.log_fd);
  s.open = false;
}

bool OutputRouter::pump(int fd) {
  for (auto& s : streams_) {
    if (!s.open || s.route.source_fd != fd) continue;
    char buf[16384];
    ssize_t n;
    do {
      n = ::read(fd, buf, sizeof buf);
    } while (n < 0 && errno == EINTR);
    if (n > 0)
      s.splitter.feed(
          buf, static_cast<std::size_t>(n), [&](const std::string& line) { emit(s, line); },
          [&](const std::string& text) { emit_status(s, text); },
          [&](const std::string& text) { finish_status(s, text); });
    else if (n == 0 || errno != EAGAIN)
      close(s);
    return true;
  }
  return false;
}

void OutputRouter::close_all() {
  for (auto& s : streams_) close(s);
}

std::vector<int> OutputRouter::open_fds() const {
  std::vector<int> fds;
  for (const auto& s : streams_)
    if (s.open) fds.push_back(s.route.source_fd);
  return fds;
}

}  // namespace cohort::launcher
