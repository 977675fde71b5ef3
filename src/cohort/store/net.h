#pragma once
// Thin POSIX socket helpers for the store: every fd is close-on-exec (a worker that
// `cohort run` starts must not inherit the store's sockets) and non-blocking, and
// every blocking step of the client is a poll() against a deadline.
#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace cohort::store::net {

using Clock = std::chrono::steady_clock;

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

// "1.2.3.4:5678"
std::string address_name(const sockaddr_in& address);

// Milliseconds from now until `deadline` for poll(), rounded up, at least 0.
int poll_timeout(Clock::time_point deadline);

enum class Io { kDone, kClosed, kTimedOut, kFailed };

// A connected, non-blocking, close-on-exec IPv4 TCP socket with TCP_NODELAY, or an
// empty Fd when this attempt failed (nobody listening yet, a name that does not
// resolve); `error` then says why.
Fd connect_once(const std::string& host, int port, Clock::time_point deadline, std::string& error);

// Whether the connected socket `fd` is joined to itself (Note [Self-connect]).
bool connected_to_itself(int fd);

// Waits until `fd` is ready for `events` (POLLIN, POLLOUT); false when `deadline`
// passed first. An error counts as ready, for the next read or write to report.
bool wait_for(int fd, short events, Clock::time_point deadline);

// Sets TCP_NODELAY: the store's requests are small and each waits for its reply.
void set_nodelay(int fd);

// Sends or receives exactly `n` bytes, or says why it could not before `deadline`.
Io write_all(int fd, const std::uint8_t* data, std::size_t n, Clock::time_point deadline);
Io read_exact(int fd, std::uint8_t* data, std::size_t n, Clock::time_point deadline);

}  // namespace cohort::store::net
