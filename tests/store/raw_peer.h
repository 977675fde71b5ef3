#pragma once
// Plain sockets for the store's tests: a peer that speaks whatever a test wants
// (garbage, a forged frame, nothing at all), and a relay that records every byte
// between a client and the server.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cohort::testing {

inline sockaddr_in ipv4(const std::string& address, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  return a;
}

// A blocking TCP connection; -1 with errno set when connect() fails.
inline int connect_raw(int port, const std::string& address = "127.0.0.1") {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  auto a = ipv4(address, port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

inline void send_raw(int fd, const std::vector<std::uint8_t>& bytes) {
  ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
}

// Exactly `n` bytes, or fewer when the peer closed or `within` passed.
inline std::vector<std::uint8_t> recv_raw(int fd, std::size_t n,
                                          std::chrono::milliseconds within = std::chrono::seconds(10)) {
  std::vector<std::uint8_t> out;
  auto deadline = std::chrono::steady_clock::now() + within;
  while (out.size() < n) {
    pollfd p{fd, POLLIN, 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    std::uint8_t buf[4096];
    ssize_t got = ::recv(fd, buf, std::min(sizeof buf, n - out.size()), 0);
    if (got <= 0) break;
    out.insert(out.end(), buf, buf + got);
  }
  return out;
}

// Whether the peer closed the connection within `within` (any data before is skipped).
inline bool closed_by_peer(int fd, std::chrono::milliseconds within = std::chrono::seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + within;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    std::uint8_t buf[4096];
    ssize_t got = ::recv(fd, buf, sizeof buf, 0);
    if (got == 0 || (got < 0 && errno == ECONNRESET)) return true;
  }
}

// Listens on 127.0.0.1:port() and forwards one connection to 127.0.0.1:target,
// keeping a copy of what each side sent.
class Relay {
 public:
  explicit Relay(int target) : target_(target) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    auto a = ipv4("127.0.0.1", 0);
    ::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listener_, 1);
    socklen_t size = sizeof a;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &size);
    port_ = ntohs(a.sin_port);
    (void)!::pipe2(stop_, O_CLOEXEC);
    thread_ = std::thread([this] { run(); });
  }
  ~Relay() {
    (void)!::write(stop_[1], "x", 1);
    thread_.join();
    for (int fd : {listener_, stop_[0], stop_[1]}) ::close(fd);
  }
  int port() const { return port_; }
  std::string from_client() {
    std::lock_guard<std::mutex> lock(mutex_);
    return from_client_;
  }
  std::string from_server() {
    std::lock_guard<std::mutex> lock(mutex_);
    return from_server_;
  }

 private:
  void run() {
    pollfd first[2] = {{stop_[0], POLLIN, 0}, {listener_, POLLIN, 0}};
    if (::poll(first, 2, -1) <= 0 || first[0].revents != 0) return;
    int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    int server = connect_raw(target_);
    for (;;) {
      pollfd fds[3] = {{stop_[0], POLLIN, 0}, {client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(fds, 3, -1) <= 0 || fds[0].revents != 0) break;
      if (fds[1].revents != 0 && !pass(client, server, from_client_)) break;
      if (fds[2].revents != 0 && !pass(server, client, from_server_)) break;
    }
    ::close(client);
    ::close(server);
  }
  bool pass(int from, int to, std::string& copy) {
    char buf[65536];
    ssize_t got = ::recv(from, buf, sizeof buf, 0);
    if (got <= 0) return false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      copy.append(buf, static_cast<std::size_t>(got));
    }
    return ::send(to, buf, static_cast<std::size_t>(got), MSG_NOSIGNAL) == got;
  }

  int target_;
  int listener_ = -1;
  int port_ = 0;
  int stop_[2] = {-1, -1};
  std::mutex mutex_;
  std::string from_client_, from_server_;
  std::thread thread_;
};

}  // namespace cohort::testing
