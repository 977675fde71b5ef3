#pragma once
// What holds a TCP port on this host, for an agent that could not listen on it
// (Note [A port held without a listener] in agent_store.cpp).
#include <cstdint>
#include <string>
#include <vector>

namespace cohort::launcher {

// One socket of /proc/net/tcp or tcp6, its endpoints as text ("127.0.0.1:20975",
// "[::1]:20975").
struct TcpSocket {
  std::string local, remote;
  unsigned state = 0;  // the kernel's numbering (include/net/tcp_states.h)
  std::uint64_t inode = 0;
};
// Every TCP socket of this host's network namespace that the kernel lists.
std::vector<TcpSocket> tcp_sockets();

// Whether a program listens on host:port (a connection is accepted, or at least not
// refused within a second). `host` is an IPv4 address of this machine.
bool listener_at(const std::string& host, int port);

// The sockets of this host's network namespace that use `port` locally, one per
// line ("127.0.0.1:20975 -> 127.0.0.1:40312, established"), from /proc/net/tcp and
// tcp6; or a sentence saying no listed socket does (one only bound, between bind
// and listen, is not listed by the kernel).
std::string port_holders(int port);

}  // namespace cohort::launcher
