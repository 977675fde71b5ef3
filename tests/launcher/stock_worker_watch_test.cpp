// Note [Telling a stock worker from a port scan]: a refused peer is the launcher's
// own when one of its descendants holds the peer's socket. Real sockets: a listener
// here, and a client in a child process (a descendant) or in this process (not one).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "cohort/launcher/stock_worker_watch.h"

namespace {
using cohort::launcher::StockWorkerWatch;
using namespace std::chrono_literals;

struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd, 4), 0);
    socklen_t n = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
  // Accepts one connection; returns its peer as the store names it, and its fd.
  std::string accept_peer(int& conn) const {
    sockaddr_in a{};
    socklen_t n = sizeof a;
    conn = ::accept(fd, reinterpret_cast<sockaddr*>(&a), &n);
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &a.sin_addr, text, sizeof text);
    return std::string(text) + ":" + std::to_string(ntohs(a.sin_port));
  }
};

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 ? fd : -1;
}

std::string not_tls(const std::string& peer) {
  return "cohort store: refused " + peer +
         ": it does not speak TLS, so not cohort's store protocol: a stock c10d TCPStore client (a worker that calls "
         "init_process_group with env:// itself), or a port scan; closed without a reply";
}

TEST(StockWorkerWatch, AWorkersSocketIsItsOwnAndNamesTheProcessAndTheFix) {
  Listener listener;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // only async-signal-safe calls here
    if (connect_to(listener.port) < 0) ::_exit(3);
    ::pause();
    ::_exit(0);
  }
  int conn = -1;
  const auto peer = listener.accept_peer(conn);
  StockWorkerWatch watch(::getpid(), 0ms);
  watch.refused("cohort store: refused " + peer + ": its TLS handshake offered no cohort key (x)");
  EXPECT_FALSE(watch.sighting()) << "only a peer that does not speak TLS is a stock worker";
  watch.refused(not_tls(peer));
  const auto seen = watch.sighting();
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(conn);
  ASSERT_TRUE(seen);
  EXPECT_NE(seen->find("process " + std::to_string(child) + " of this job"), std::string::npos) << *seen;
  EXPECT_NE(seen->find("from " + peer + " with c10d's plain TCPStore protocol"), std::string::npos) << *seen;
  EXPECT_NE(seen->find("--rdzv-conf worker_store=tcpstore"), std::string::npos) << *seen;
}

TEST(StockWorkerWatch, APeerNoDescendantHoldsIsOnlyReported) {
  Listener listener;
  const int mine = connect_to(listener.port);  // this process is the root, not a descendant
  ASSERT_GE(mine, 0);
  int conn = -1;
  const auto peer = listener.accept_peer(conn);
  StockWorkerWatch watch(::getpid(), 0ms);
  watch.refused(not_tls(peer));
  EXPECT_FALSE(watch.sighting());
  watch.refused(not_tls("127.0.0.1:1"));  // no such socket at all (another host's, or gone)
  EXPECT_FALSE(watch.sighting());
  // Seen from the parent of this process, the same socket is a descendant's.
  StockWorkerWatch from_above(::getppid(), 0ms);
  from_above.refused(not_tls(peer));
  ASSERT_TRUE(from_above.sighting());
  EXPECT_NE(from_above.sighting()->find("process " + std::to_string(::getpid())), std::string::npos);
  ::close(mine);
  ::close(conn);
}

TEST(StockWorkerWatch, LooksAtMostOncePerIntervalUntilItSees) {
  Listener listener;
  const int mine = connect_to(listener.port);
  int conn = -1;
  const auto peer = listener.accept_peer(conn);
  StockWorkerWatch watch(::getppid(), 1h);
  watch.refused(not_tls("127.0.0.1:1"));  // looked, found nothing
  watch.refused(not_tls(peer));           // within the interval: not looked at
  EXPECT_FALSE(watch.sighting());
  ::close(mine);
  ::close(conn);
}

}  // namespace
