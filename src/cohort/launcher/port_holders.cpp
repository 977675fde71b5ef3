#include "cohort/launcher/port_holders.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace cohort::launcher {
namespace {

// The kernel's TCP states, numbered as in include/net/tcp_states.h.
const char* state_name(unsigned state) {
  static const char* const names[] = {"?",         "established", "syn-sent", "syn-received", "fin-wait-1",
                                      "fin-wait-2", "time-wait",  "closed",   "close-wait",   "last-ack",
                                      "listening",  "closing",    "new-syn-received"};
  return state < sizeof names / sizeof names[0] ? names[state] : "?";
}

// "0100007F:51EF" (an address as the kernel stores it, in hex) -> "127.0.0.1:20975".
std::string endpoint_text(const std::string& hex, bool v6) {
  const auto colon = hex.find(':');
  if (colon == std::string::npos) return hex;
  const auto port = std::stoul(hex.substr(colon + 1), nullptr, 16);
  const std::string addr = hex.substr(0, colon);
  char text[INET6_ADDRSTRLEN] = {};
  if (!v6 && addr.size() == 8) {
    in_addr a{};
    a.s_addr = static_cast<std::uint32_t>(std::stoul(addr, nullptr, 16));  // already in network order
    inet_ntop(AF_INET, &a, text, sizeof text);
  } else if (v6 && addr.size() == 32) {
    in6_addr a{};
    for (int word = 0; word < 4; ++word) {
      const auto w = static_cast<std::uint32_t>(std::stoul(addr.substr(8 * static_cast<size_t>(word), 8), nullptr, 16));
      std::memcpy(a.s6_addr + 4 * word, &w, 4);
    }
    inet_ntop(AF_INET6, &a, text, sizeof text);
  } else {
    return hex;
  }
  return v6 ? fmt::format("[{}]:{}", text, port) : fmt::format("{}:{}", text, port);
}

void read_table(const char* table, bool v6, std::vector<TcpSocket>& out) {
  std::ifstream in(table);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout;
    std::uint64_t inode = 0;
    if (!(fields >> slot >> local >> remote >> state)) continue;
    TcpSocket socket{endpoint_text(local, v6), endpoint_text(remote, v6),
                     static_cast<unsigned>(std::stoul(state, nullptr, 16)), 0};
    if (fields >> queues >> timer >> retransmits >> uid >> timeout >> inode) socket.inode = inode;
    out.push_back(std::move(socket));
  }
}

int port_of(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  return colon == std::string::npos ? -1 : std::atoi(endpoint.c_str() + colon + 1);
}

}  // namespace

bool listener_at(const std::string& host, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;  // cannot tell: let the handshake decide
  timeval limit{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    ::close(fd);
    return true;
  }
  const bool refused = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 && errno == ECONNREFUSED;
  ::close(fd);
  return !refused;
}

std::vector<TcpSocket> tcp_sockets() {
  std::vector<TcpSocket> out;
  read_table("/proc/net/tcp", false, out);
  read_table("/proc/net/tcp6", true, out);
  return out;
}

std::string port_holders(int port) {
  std::string out;
  for (const auto& s : tcp_sockets())
    if (port_of(s.local) == port) out += fmt::format("    {} -> {}, {}\n", s.local, s.remote, state_name(s.state));
  if (out.empty())
    return fmt::format("    no socket of /proc/net/tcp uses port {}: one is bound without listening (a program "
                       "between bind and listen; the kernel lists no such socket)\n",
                       port);
  return out;
}

}  // namespace cohort::launcher
