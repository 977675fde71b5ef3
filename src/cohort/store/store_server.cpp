#include "cohort/store/store_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include <fmt/format.h>

#include "cohort/errors.h"
#include "cohort/store/server_loop.h"

namespace cohort::store {
namespace {

void validate(const StoreServerOptions& o) {
  if (o.token().empty())
    throw ConfigError("cohort: the store's token is empty\n  fix: pass the job's --rdzv-token / COHORT_RDZV_TOKEN "
                      "(any non-empty secret shared by the job)");
  in_addr unused{};
  if (::inet_pton(AF_INET, o.bind_address().c_str(), &unused) != 1)
    throw ConfigError(fmt::format("cohort: the store's bind address '{}' is not an IPv4 address\n  fix: give one of "
                                  "this host's IPv4 addresses, 127.0.0.1 for this host only, or 0.0.0.0 for every "
                                  "interface",
                                  o.bind_address()));
  if (o.port() < 0 || o.port() > 65535)
    throw ConfigError(fmt::format("cohort: the store's port {} is not in 0..65535 (0 picks a free one)", o.port()));
  if (o.handshake_timeout().count() <= 0)
    throw ConfigError("cohort: the store's handshake timeout must be > 0");
  // Note [Buffers per connection]: any value the table takes must fit in one reply.
  if (o.max_buffer_bytes() < o.max_value_bytes() + kReplyOverheadBytes)
    throw ConfigError(fmt::format("cohort: the store's max_buffer_bytes ({}) must be at least max_value_bytes ({}) "
                                  "+ {}, so that every value it stores can be read back in one reply",
                                  o.max_buffer_bytes(), o.max_value_bytes(), kReplyOverheadBytes));
}

net::Fd listen_on(const StoreServerOptions& o, int& port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(o.port()));
  ::inet_pton(AF_INET, o.bind_address().c_str(), &address.sin_addr);
  net::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) throw CommError(fmt::format("cohort: the store could not make a socket: {}", std::strerror(errno)));
  // A restarted agent must be able to listen again while the last one's
  // connections are still in TIME_WAIT.
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(fd.get(), SOMAXCONN) != 0) {
    int err = errno;
    const char* fix = err == EADDRINUSE      ? "something else listens on that port; pick another, or 0 for a free one"
                      : err == EADDRNOTAVAIL ? "that address is not one of this host's; use one that is, or 0.0.0.0"
                      : err == EACCES        ? "ports below 1024 need privileges; pick a port >= 1024"
                                             : "check the address and port";
    throw ConfigError(fmt::format("cohort: the store cannot listen on {}:{}: {}\n  fix: {}", o.bind_address(),
                                  o.port(), std::strerror(err), fix));
  }
  socklen_t size = sizeof address;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &size);
  port = ntohs(address.sin_port);
  return fd;
}

}  // namespace

StoreServer::StoreServer(StoreServerOptions options) {
  validate(options);
  auto listener = listen_on(options, port_);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0)
    throw CommError(fmt::format("cohort: the store could not make its wake-up pipe: {}", std::strerror(errno)));
  net::Fd wake(pipe_fds[1]);
  loop_ = std::make_unique<ServerLoop>(std::move(options), std::move(listener), net::Fd(pipe_fds[0]));
  wake_ = wake.release();
  thread_ = std::thread([loop = loop_.get()] { loop->run(); });
}

StoreServer::~StoreServer() {
  const char byte = 0;
  while (::write(wake_, &byte, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
  ::close(wake_);
}

int StoreServer::port() const { return port_; }

std::int64_t StoreServer::refused() const { return loop_->refused(); }

}  // namespace cohort::store
