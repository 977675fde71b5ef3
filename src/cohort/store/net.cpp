#include "cohort/store/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>

namespace cohort::store::net {

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string address_name(const sockaddr_in& address) {
  char text[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &address.sin_addr, text, sizeof text);
  return std::string(text) + ":" + std::to_string(ntohs(address.sin_port));
}

int poll_timeout(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1 << 30 ? 1 << 30 : static_cast<int>(left);
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, poll_timeout(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return true;  // let the read or write report the error
  }
}

// Note [Self-connect]: connecting to a port of this host on which nothing listens
// can succeed when the port lies in the ephemeral range: the kernel may give the
// socket that very port as its local one, and TCP's simultaneous open joins the
// socket to itself. A client retrying until the store host is up would then read
// its own bytes and, worse, hold the port, so that the agent meant to host the
// store fails to bind it. Such a connection is dropped at once, as a refusal.
bool connected_to_itself(int fd) {
  sockaddr_in local{}, peer{};
  socklen_t local_len = sizeof local, peer_len = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0)
    return false;
  return local.sin_port == peer.sin_port && local.sin_addr.s_addr == peer.sin_addr.s_addr;
}

Fd connect_once(const std::string& host, int port, Clock::time_point deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_INET;  // the server binds an IPv4 address (StoreServerOptions::bind_address)
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    error = "cannot resolve '" + host + "': " + ::gai_strerror(rc);
    return Fd();
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(found, &::freeaddrinfo);
  for (auto* a = found; a != nullptr; a = a->ai_next) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) {
      error = std::string("socket(): ") + std::strerror(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        if (!wait_for(fd.get(), POLLOUT, deadline)) {
          error = "connect() did not complete in time";
          continue;
        }
        socklen_t len = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    if (err != 0) {
      error = std::string("connect(): ") + std::strerror(err);
      continue;
    }
    if (connected_to_itself(fd.get())) {
      error = "connect(): nothing listens there (the socket connected to itself)";
      continue;
    }
    set_nodelay(fd.get());
    return fd;
  }
  return Fd();
}

Io write_all(int fd, const std::uint8_t* data, std::size_t n, Clock::time_point deadline) {
  while (n > 0) {
    ssize_t sent = ::send(fd, data, n, MSG_NOSIGNAL);
    if (sent > 0) {
      data += sent;
      n -= static_cast<std::size_t>(sent);
    } else if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!wait_for(fd, POLLOUT, deadline)) return Io::kTimedOut;
    } else {
      return errno == EPIPE || errno == ECONNRESET ? Io::kClosed : Io::kFailed;
    }
  }
  return Io::kDone;
}

Io read_exact(int fd, std::uint8_t* data, std::size_t n, Clock::time_point deadline) {
  while (n > 0) {
    ssize_t got = ::recv(fd, data, n, 0);
    if (got > 0) {
      data += got;
      n -= static_cast<std::size_t>(got);
    } else if (got == 0) {
      return Io::kClosed;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!wait_for(fd, POLLIN, deadline)) return Io::kTimedOut;
    } else {
      return errno == ECONNRESET ? Io::kClosed : Io::kFailed;
    }
  }
  return Io::kDone;
}

}  // namespace cohort::store::net
