#include "cohort/launcher/output_router.h"

#include <unistd.h>

#include <cerrno>

namespace cohort::launcher {
namespace {

void write_all(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed console must not stop the job
    done += static_cast<std::size_t>(n);
  }
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
  streams_.push_back(std::move(s));
}


void OutputRouter::emit(const Stream& s, const std::string& line) {
  if (s.route.console_fd >= 0) {
    // "\r" then "erase line" clears an open status line, wherever it is drawn: stdout
    // and stderr usually share the terminal (Note [Progress lines]).
    if (status_console_ >= 0) {
      write_all(status_console_, "\r\x1b[K");
      status_console_ = -1;
    }
    write_all(s.route.console_fd, s.route.prefix + line + "\n");
  }
  if (s.route.log_fd >= 0) write_all(s.route.log_fd, without_erase(line) + "\n");
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

void OutputRouter::close(Stream& s) {
  if (!s.open) return;
  s.splitter.finish([&](const std::string& line) { emit(s, line); });
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
          [&](const std::string& text) { emit_status(s, text); });
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
