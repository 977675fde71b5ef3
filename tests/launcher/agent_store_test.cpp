// Which agent hosts the job's store when a port is contended (Note [Who hosts the
// store], Note [A port held without a listener]).
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "cohort/errors.h"
#include "cohort/launcher/agent_store.h"
#include "support/subprocess.h"

namespace {
using namespace cohort::launcher;
using namespace std::chrono_literals;

const std::string kToken = "agent-store-test-token-0123456789";

RunOptions at(int port) {
  RunOptions o;
  o.rdzv_endpoint = "127.0.0.1:" + std::to_string(port);
  return o;
}

AgentStore open(int port) {
  return open_agent_store(at(port), kToken, cohort::store::Certificates{}, 10s, [] {});
}

int bound_socket(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  return fd;
}

// Stop 35's CI: two agents found the port held by a socket that did not listen,
// probed for 5 s, and both gave up, so the job never started.
TEST(AgentStore, APortHeldForAMomentByASocketThatDoesNotListenIsHostedOnceFree) {
  const int port = cohort::testing::free_port();
  int holder = bound_socket(port);
  std::thread release([holder] {
    std::this_thread::sleep_for(400ms);
    ::close(holder);
  });
  AgentStore s;
  try {
    s = open(port);
  } catch (const std::exception& e) {
    release.join();
    FAIL() << e.what();
  }
  release.join();
  ASSERT_NE(s.server, nullptr) << "the port was free again after 400 ms, yet this agent did not host";
  EXPECT_EQ(s.port, port);
  const std::vector<uint8_t> value{1, 2, 3};
  s.client->set("k", value);
  EXPECT_EQ(s.client->get("k"), value);
}

TEST(AgentStore, APortHeldByAConnectionIsRefusedNamingTheConnection) {
  const int port = cohort::testing::free_port();
  // A connection that uses the port as its local end, to a listener elsewhere.
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &any.sin_addr);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&any), sizeof any), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  socklen_t size = sizeof any;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&any), &size);
  int client = bound_socket(port);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&any), sizeof any), 0) << std::strerror(errno);
  const auto begin = std::chrono::steady_clock::now();
  try {
    open(port);
    ADD_FAILURE() << "hosted on a port a connection holds";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("nothing listened on the port"), std::string::npos) << what;
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(port) + " -> 127.0.0.1:" + std::to_string(ntohs(any.sin_port)) +
                        ", established"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("fix:"), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - begin, 9s);
  ::close(client);
  ::close(listener);
}

// Agents of one job started at once on one host: one hosts, the others join it.
TEST(AgentStore, OfAgentsStartedTogetherOneHostsAndTheOthersJoin) {
  const int port = cohort::testing::free_port();
  for (int round = 0; round < 30; ++round) {
    std::atomic<int> ready{0};
    AgentStore stores[3];
    std::string errors[3];
    auto start = [&](int i) {
      ready.fetch_add(1);
      while (ready.load() < 3) std::this_thread::yield();
      try {
        stores[i] = open(port);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    };
    std::thread a(start, 0), b(start, 1), c(start, 2);
    a.join();
    b.join();
    c.join();
    int hosts = 0;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(errors[i].empty()) << "round " << round << ", agent " << i << ": " << errors[i];
      hosts += stores[i].server ? 1 : 0;
    }
    ASSERT_EQ(hosts, 1) << "round " << round;
    const std::vector<uint8_t> value{static_cast<uint8_t>(round)};
    stores[1].client->set("round", value);
    EXPECT_EQ(stores[2].client->get("round"), value);
  }
}

}  // namespace
