// Where the server listens: only on the address it was given, never on a port
// another holds, and never with options that make no sense.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "cohort/errors.h"
#include "cohort/store/net.h"
#include "cohort/store/server_loop.h"
#include "cohort/store/store_client.h"
#include "cohort/store/store_server.h"
#include "store/raw_peer.h"

namespace {
using cohort::store::StoreServer;
using cohort::store::StoreServerOptions;
using cohort::testing::connect_raw;

const std::string kToken = "listener-token";

// This host's IPv4 addresses other than loopback (none in a bare container).
std::vector<std::string> other_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (auto* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {0};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    if (std::string(text).rfind("127.", 0) != 0) out.push_back(text);
  }
  ::freeifaddrs(list);
  return out;
}

bool reachable(int port, const std::string& address) {
  int fd = connect_raw(port, address);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

TEST(StoreListener, LoopbackIsReachableOnlyThroughLoopback) {
  StoreServer server{StoreServerOptions(kToken)};  // 127.0.0.1 by default
  EXPECT_TRUE(reachable(server.port(), "127.0.0.1"));
  // Linux routes all of 127/8 to lo, but a socket bound to 127.0.0.1 takes only that.
  EXPECT_FALSE(reachable(server.port(), "127.0.0.2"));
  for (const auto& address : other_addresses())
    EXPECT_FALSE(reachable(server.port(), address)) << "reachable through " << address;
}

TEST(StoreListener, EveryInterfaceIsReachableWhenAsked) {
  StoreServer server(StoreServerOptions(kToken).bind_address("0.0.0.0"));
  EXPECT_TRUE(reachable(server.port(), "127.0.0.2"));
  for (const auto& address : other_addresses())
    EXPECT_TRUE(reachable(server.port(), address)) << "unreachable through " << address;
  cohort::store::StoreClient client("127.0.0.2", server.port(), kToken, std::chrono::seconds(10));
  EXPECT_EQ(client.getNumKeys(), 0);
}

TEST(StoreListener, ABusyPortIsAConfigErrorNamingIt) {
  StoreServer first{StoreServerOptions(kToken)};
  try {
    StoreServer second(StoreServerOptions(kToken).port(first.port()));
    FAIL() << "two servers listen on one port";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(first.port())), std::string::npos)
        << e.what();
  }
}

std::set<int> open_fds() {
  std::set<int> listed, out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd"))
    listed.insert(std::stoi(entry.path().filename().string()));
  for (int fd : listed)
    if (::fcntl(fd, F_GETFD) >= 0) out.insert(fd);  // not the listing's own, closed by now
  return out;
}

TEST(StoreListener, NoDescriptorLeaksIntoChildren) {
  auto before = open_fds();
  StoreServer server{StoreServerOptions(kToken)};
  cohort::store::StoreClient client("127.0.0.1", server.port(), kToken, std::chrono::seconds(10));
  client.set("k", std::vector<std::uint8_t>{1});  // the server has accepted the connection by now
  int checked = 0;
  for (int fd : open_fds()) {
    if (before.count(fd) != 0) continue;
    EXPECT_TRUE(::fcntl(fd, F_GETFD) & FD_CLOEXEC) << "fd " << fd << " would leak into a worker";
    ++checked;
  }
  EXPECT_GE(checked, 5);  // listener, wake pipe (2), the two ends of the connection
}

// Note [Self-connect]: a socket bound to port P that connects to P joins itself
// (what the kernel may do to a client whose ephemeral port is the target). The
// client must see that as nobody listening; a real server's socket is not so.
TEST(StoreListener, ASocketJoinedToItselfIsToldApartFromAServer) {
  cohort::store::net::Fd self(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(self.get(), reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  socklen_t len = sizeof address;
  ASSERT_EQ(::getsockname(self.get(), reinterpret_cast<sockaddr*>(&address), &len), 0);
  ASSERT_EQ(::connect(self.get(), reinterpret_cast<sockaddr*>(&address), sizeof address), 0) << std::strerror(errno);
  EXPECT_TRUE(cohort::store::net::connected_to_itself(self.get()));

  StoreServer server{StoreServerOptions(kToken)};
  std::string error;
  auto fd = cohort::store::net::connect_once("127.0.0.1", server.port(),
                                             cohort::store::net::Clock::now() + std::chrono::seconds(10), error);
  ASSERT_TRUE(fd) << error;
  EXPECT_FALSE(cohort::store::net::connected_to_itself(fd.get()));
}

// Note [Out of descriptors]: at the open-files limit the store says why it stops
// accepting (once, not once per retry), keeps its loop alive, and takes the waiting
// peers as soon as descriptors free up.
TEST(StoreListener, OutOfDescriptorsIsReportedOnceAndServingGoesOn) {
  StoreServer server{StoreServerOptions(kToken)};
  cohort::store::StoreClient early("127.0.0.1", server.port(), kToken, std::chrono::seconds(10));
  early.set("k", std::vector<std::uint8_t>{7});
  testing::internal::CaptureStderr();
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  int top = 0;
  for (int fd : open_fds()) top = std::max(top, fd);
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(top + 16);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  // The socket is made before the descriptors run out, and connects after: its
  // connection then waits in the backlog for an accept() that fails.
  const int waiting = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(waiting, 0);
  std::vector<int> hogs;
  for (int fd; (fd = ::fcntl(0, F_DUPFD_CLOEXEC, 0)) >= 0;) hogs.push_back(fd);
  const int hog_errno = errno;
  auto address = cohort::testing::ipv4("127.0.0.1", server.port());
  EXPECT_EQ(::connect(waiting, reinterpret_cast<sockaddr*>(&address), sizeof address), 0) << std::strerror(errno);
  // Note [Events, not sleeps] (vote_quorum_test.cpp): the server has met the failure
  // once it has reported it. Its report is the only thing written to the captured
  // stderr (a file on fd 2, which fstat reads without a descriptor of its own), so
  // wait, bounded, for that file to grow: a sleep alone let a busy machine close the
  // hogs before the server's loop had run at all.
  const auto reported = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  struct stat captured {};
  while (::fstat(STDERR_FILENO, &captured) == 0 && captured.st_size == 0 && std::chrono::steady_clock::now() < reported)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the poll interval of a bounded wait
  // Then several accept() retries (every kAcceptBackoff) fail meanwhile: time passing
  // is the scenario here, to show the report is made once, not once per retry.
  std::this_thread::sleep_for(4 * cohort::store::kAcceptBackoff);
  for (int fd : hogs) ::close(fd);
  ::setrlimit(RLIMIT_NOFILE, &saved);
  EXPECT_EQ(hog_errno, EMFILE);
  // The store still serves: the connection it had, and a new one.
  EXPECT_EQ(early.get("k"), std::vector<std::uint8_t>{7});
  cohort::store::StoreClient later("127.0.0.1", server.port(), kToken, std::chrono::seconds(10));
  EXPECT_EQ(later.get("k"), std::vector<std::uint8_t>{7});
  ::close(waiting);
  const auto err = testing::internal::GetCapturedStderr();
  const std::string headline = "cannot accept connections: accept(): Too many open files";
  const auto first = err.find(headline);
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find(headline, first + 1), std::string::npos) << "reported more than once:\n" << err;
  EXPECT_NE(err.find("RLIMIT_NOFILE: soft " + std::to_string(top + 16)), std::string::npos) << err;
  EXPECT_NE(err.find("accepts connections again"), std::string::npos) << err;
}

TEST(StoreListener, NonsenseOptionsAreConfigErrors) {
  EXPECT_THROW(StoreServer(StoreServerOptions("")), cohort::ConfigError);
  EXPECT_THROW(StoreServer(StoreServerOptions(kToken).bind_address("localhost")), cohort::ConfigError);
  EXPECT_THROW(StoreServer(StoreServerOptions(kToken).port(70000)), cohort::ConfigError);
  EXPECT_THROW(cohort::store::StoreClient("127.0.0.1", 1, "", std::chrono::seconds(1)), cohort::ConfigError);
}

}  // namespace
