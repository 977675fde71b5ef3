#include "cohort/launcher/console_relay.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>

namespace cohort::launcher {

// ------------------------------------------------------------ ConsoleBuffer ----

void ConsoleBuffer::put(const char* data, std::size_t n) {
  std::size_t at = 0;
  while (at < n) {
    const void* nl = std::memchr(data + at, '\n', n - at);
    const std::size_t end = nl ? static_cast<std::size_t>(static_cast<const char*>(nl) - data) + 1 : n;
    put_segment(data + at, end - at, nl != nullptr);
    at = end;
  }
}

void ConsoleBuffer::put_segment(const char* data, std::size_t n, bool ends_line) {
  if (dropping_line_) {  // the rest of a dropped line goes too
    if (ends_line) dropping_line_ = false;
    return;
  }
  // Nothing more is kept before the notice of what was dropped: the console must
  // not show later lines as if nothing had been lost before them.
  if (unreported_ > 0 && !open_line_) {
    auto text = notice();
    if (pending_.size() + text.size() + n <= capacity_) {
      pending_ += text;
      unreported_ = 0;
    }
  }
  if (unreported_ == 0 && pending_.size() + n <= capacity_) {
    pending_.append(data, n);
    open_line_ = !ends_line;
    return;
  }
  if (open_line_) {  // a line begun in the buffer: end it where its rest is cut
    pending_ += '\n';
    open_line_ = false;
  }
  ++dropped_;
  ++unreported_;
  dropping_line_ = !ends_line;
}

std::string ConsoleBuffer::notice() {
  return fmt::format(
      "cohort run: {} line{} of output dropped here: nothing read this console, and the launcher does not wait "
      "for it (worker logs keep every line: --log-dir DIR with --redirects 3 or --tee 3)\n",
      unreported_, unreported_ == 1 ? "" : "s");
}

bool ConsoleBuffer::empty() const { return pending_.empty() && (unreported_ == 0 || open_line_); }

std::string ConsoleBuffer::take(std::size_t max) {
  std::string out;
  if (pending_.empty()) {
    if (unreported_ > 0 && !open_line_) {
      out = notice();
      unreported_ = 0;
    }
    return out;
  }
  const std::size_t k = std::min(max, pending_.size());
  out.assign(pending_, 0, k);
  pending_.erase(0, k);
  return out;
}

// ------------------------------------------------------------- ConsoleRelay ----

struct ConsoleRelay::Channel {
  explicit Channel(int replaced, std::size_t capacity) : fd(replaced), buffer(capacity) {}
  ~Channel() {
    if (original >= 0) ::close(original);
    if (read_end >= 0) ::close(read_end);
    if (write_end >= 0) ::close(write_end);
  }
  void read_loop();
  void write_loop();

  const int fd;        // the descriptor replaced (1 or 2)
  int original = -1;   // where it pointed (close-on-exec)
  int read_end = -1;   // our pipe, read by read_loop
  int write_end = -1;  // until the switch; then `fd` is the write end
  std::mutex mu;
  std::condition_variable cv;
  ConsoleBuffer buffer;
  bool input_closed = false;    // every writer of the pipe is gone
  bool console_failed = false;  // a write failed (a closed console): discard from now on
  bool done = false;            // write_loop has returned
};

namespace {

bool write_all(int fd, const std::string& data) {
  std::size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = ::write(fd, data.data() + sent, data.size() - sent);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

[[noreturn]] void fail(const char* what) { throw std::system_error(errno, std::generic_category(), what); }

}  // namespace

void ConsoleRelay::Channel::read_loop() {
  // Never blocks on the console: it only moves bytes from the pipe to the buffer.
  std::vector<char> chunk(64 * 1024);
  for (;;) {
    ssize_t n = ::read(read_end, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    std::lock_guard<std::mutex> lock(mu);
    if (!console_failed) buffer.put(chunk.data(), static_cast<std::size_t>(n));
    cv.notify_all();
  }
  std::lock_guard<std::mutex> lock(mu);
  input_closed = true;
  cv.notify_all();
}

void ConsoleRelay::Channel::write_loop() {
  // The only thread that may block on the console.
  for (;;) {
    std::string next;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !buffer.empty() || input_closed; });
      if (buffer.empty()) break;  // the input is closed and everything is out
      next = buffer.take(64 * 1024);
    }
    if (!write_all(original, next)) {
      std::lock_guard<std::mutex> lock(mu);
      console_failed = true;  // as before the relay: output to a gone console is lost
      buffer.discard();
      break;
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  // All out, after finish() put the original back: let go of our copy of it, so
  // that a console pipe's reader sees its end once the launcher closes it too.
  if (!console_failed && original >= 0) {
    ::close(original);
    original = -1;
  }
  done = true;
  cv.notify_all();
}

ConsoleRelay::ConsoleRelay(std::vector<int> fds, std::size_t capacity) {
  // The relay's threads take no signals: the launcher's handlers stay on its own
  // threads, and a write to a closed console fails with EPIPE instead of killing
  // the launcher with SIGPIPE.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  try {
    for (int fd : fds) {
      auto c = std::make_shared<Channel>(fd, capacity);
      int ends[2];
      if (::pipe2(ends, O_CLOEXEC) != 0) fail("cohort run: pipe2() for the console relay");
      c->read_end = ends[0];
      c->write_end = ends[1];
      c->original = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
      if (c->original < 0) fail("cohort run: dup() of a console descriptor");
      std::thread([c] { c->read_loop(); }).detach();
      std::thread([c] { c->write_loop(); }).detach();
      channels_.push_back(std::move(c));
    }
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    for (auto& c : channels_) {  // their readers see the end of input; their threads end
      ::close(c->write_end);
      c->write_end = -1;
    }
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  // The switch, last: until here nothing printed went anywhere new.
  std::fflush(stdout);
  std::fflush(stderr);
  for (auto& c : channels_) {
    ::dup2(c->write_end, c->fd);
    ::close(c->write_end);
    c->write_end = -1;
  }
}

// Waits only when finish() was not called: the launcher's finish() has waited its
// drain already, and a second wait here made a stalled console cost twice that at
// exit (11 s instead of 5). The channels' threads own their state, so nothing here
// needs them to end.
ConsoleRelay::~ConsoleRelay() {
  if (!finished_) finish();
}

bool ConsoleRelay::finish(std::chrono::milliseconds drain) {
  if (!finished_) {
    finished_ = true;
    std::fflush(stdout);
    std::fflush(stderr);
    // The pipe's only write end is `fd`: putting the original back closes it, so the
    // reader sees the end of input once the pipe is empty.
    for (auto& c : channels_) ::dup2(c->original, c->fd);
  }
  const auto deadline = std::chrono::steady_clock::now() + drain;
  bool all_out = true;
  for (auto& c : channels_) {
    std::unique_lock<std::mutex> lock(c->mu);
    all_out = c->cv.wait_until(lock, deadline, [&] { return c->done; }) && !c->console_failed && all_out;
  }
  return all_out;
}

std::int64_t ConsoleRelay::dropped_lines() const {
  std::int64_t n = 0;
  for (const auto& c : channels_) {
    std::lock_guard<std::mutex> lock(c->mu);
    n += c->buffer.dropped_lines();
  }
  return n;
}

}  // namespace cohort::launcher
