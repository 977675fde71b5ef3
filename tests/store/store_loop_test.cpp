// The server's loop at scale (Note [The loop's cost per wake-up] in
// store/server_loop.h): idle connections cost nothing per request, a write wakes
// exactly the waiters of its keys, and requests a peer pipelined into one burst are
// all served, even past the records the loop reads at one wake-up.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "cohort/store/server_loop.h"
#include "cohort/store/store_client.h"
#include "cohort/util/bytes.h"
#include "store/raw_peer.h"
#include "store/tls_peer.h"

namespace {
namespace store = cohort::store;
using cohort::testing::HandRolled;
using cohort::testing::tls_peer;
using cohort::util::from_bytes;
using cohort::util::to_bytes;
using namespace std::chrono_literals;

const std::string kToken = "loop-token-5e21";

// A ServerLoop on its own thread, as StoreServer runs it, so that a test can read
// its visits() and parked().
struct LoopOnThread {
  int port = 0;
  int wake = -1;
  std::unique_ptr<store::ServerLoop> loop;
  std::thread thread;

  LoopOnThread() {
    store::net::Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    auto address = cohort::testing::ipv4("127.0.0.1", 0);
    EXPECT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(::listen(listener.get(), SOMAXCONN), 0);
    socklen_t size = sizeof address;
    ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&address), &size);
    port = ntohs(address.sin_port);
    int fds[2];
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC | O_NONBLOCK), 0);
    wake = fds[1];
    loop = std::make_unique<store::ServerLoop>(store::StoreServerOptions(kToken), std::move(listener),
                                               store::net::Fd(fds[0]));
    thread = std::thread([this] { loop->run(); });
  }
  ~LoopOnThread() {
    (void)!::write(wake, "x", 1);
    thread.join();
    ::close(wake);
  }
  c10::intrusive_ptr<store::StoreClient> client() {
    return c10::make_intrusive<store::StoreClient>("127.0.0.1", port, kToken, 10s);
  }
  // Until `n` requests are parked in the server, at most 10 s.
  bool parked_reaches(std::int64_t n) {
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (loop->parked() != n && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
    return loop->parked() == n;
  }
};

// Each idle connection takes two descriptors in this process (the client's and the
// server's); raise the soft limit as far as the hard one allows, and fit under it.
int idle_connections_that_fit(int wanted) {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
  ::getrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_cur == RLIM_INFINITY) return wanted;
  return std::max(0, std::min<int>(wanted, static_cast<int>((limit.rlim_cur - 128) / 2)));
}

store::Bytes framed(const store::Request& r) { return store::frame(store::encode(r)); }

TEST(StoreLoop, AWriteWakesOnlyItsKeysWaiterWhileAThousandConnectionsIdle) {
  LoopOnThread server;
  const int count = idle_connections_that_fit(1000);
  ASSERT_GE(count, 100) << "RLIMIT_NOFILE leaves room for too few connections";
  std::vector<std::unique_ptr<HandRolled>> idle;
  for (int i = 0; i < count; ++i) idle.push_back(tls_peer(server.port, kToken));
  auto writer = server.client();
  auto waiter = server.client();
  auto other = server.client();
  auto got = std::async(std::launch::async, [&] { return from_bytes(waiter->get("go")); });
  auto elsewhere = std::async(std::launch::async, [&] { other->wait({"elsewhere"}); });
  ASSERT_TRUE(server.parked_reaches(2));

  // Each request is one event on one connection: the idle ones are never visited.
  constexpr int kRequests = 200;
  auto before = server.loop->visits();
  for (int i = 0; i < kRequests; ++i) writer->add("counter", 1);
  EXPECT_LE(server.loop->visits() - before, 3 * kRequests)
      << "with " << count << " idle connections, requests visited more than their own";

  // The set visits its writer and the one waiter of its key, not the other waiter.
  before = server.loop->visits();
  writer->set("go", to_bytes("v"));
  ASSERT_EQ(got.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(got.get(), "v");
  EXPECT_LE(server.loop->visits() - before, 4);
  writer->check({"go"});  // a round trip: the loop has finished the set's round
  EXPECT_EQ(server.loop->parked(), 1);
  EXPECT_EQ(elsewhere.wait_for(0s), std::future_status::timeout);
  writer->set("elsewhere", to_bytes("x"));
  ASSERT_EQ(elsewhere.wait_for(10s), std::future_status::ready);
  elsewhere.get();
  EXPECT_EQ(server.loop->parked(), 0);
  EXPECT_EQ(writer->add("counter", 0), kRequests);
}

// Note [Waking waiters by key]: a wait on two keys ends only once both exist, a
// DELETE wakes nobody, and one write releases every waiter of its key.
TEST(StoreLoop, WaitersOfSeveralKeysAndManyWaitersOfOneKey) {
  LoopOnThread server;
  auto writer = server.client();
  auto waiter = server.client();
  auto both = std::async(std::launch::async, [&] { waiter->wait({"a", "b"}); });
  ASSERT_TRUE(server.parked_reaches(1));
  writer->set("a", to_bytes("1"));
  writer->deleteKey("a");
  writer->set("b", to_bytes("2"));
  writer->check({"b"});  // a round trip: the rounds of the writes are over
  EXPECT_EQ(server.loop->parked(), 1) << "a wait on two keys ended with one of them missing";
  EXPECT_EQ(both.wait_for(0s), std::future_status::timeout);
  writer->set("a", to_bytes("3"));
  ASSERT_EQ(both.wait_for(10s), std::future_status::ready);
  both.get();

  constexpr int kWaiters = 32;
  std::vector<c10::intrusive_ptr<store::StoreClient>> clients;
  std::vector<std::future<std::string>> gets;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(server.client());
  for (auto& c : clients) gets.push_back(std::async(std::launch::async, [c] { return from_bytes(c->get("all")); }));
  ASSERT_TRUE(server.parked_reaches(kWaiters));
  writer->set("all", to_bytes("go"));
  for (auto& g : gets) {
    ASSERT_EQ(g.wait_for(10s), std::future_status::ready);
    EXPECT_EQ(g.get(), "go");
  }
  EXPECT_EQ(server.loop->parked(), 0);
}

// Requests a peer sends without waiting for replies: behind a parked GET in one TLS
// record, then as many records as the loop reads at one wake-up (16) four times over,
// written at once. Every one is answered, in order, with no more bytes from the peer:
// what the loop leaves in the connection's buffer, in OpenSSL (which reads the whole
// burst ahead in one recv(); Note [Buffered TLS plaintext]) or in the socket is
// served without waiting for more. Without the loop's list of connections with
// buffered TLS data, reply 82 never comes.
TEST(StoreLoop, RequestsPipelinedInOneBurstAreAllServedInOrder) {
  LoopOnThread server;
  auto writer = server.client();
  auto peer = tls_peer(server.port, kToken);
  constexpr int kBurst = 64;
  store::Bytes one_record = framed(store::Request{store::Op::kGet, 10000, {"late"}, {}});
  for (int i = 0; i < kBurst; ++i) {
    auto add = framed(store::Request{store::Op::kAdd, 1, {"n"}, {}});
    one_record.insert(one_record.end(), add.begin(), add.end());
  }
  peer->send(one_record);
  ASSERT_TRUE(server.parked_reaches(1));
  writer->set("late", to_bytes("here"));
  auto first = peer->reply();
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, store::Status::kOk);
  EXPECT_EQ(from_bytes(first->values.at(0)), "here");
  for (int i = 1; i <= kBurst; ++i) {
    auto r = peer->reply();
    ASSERT_TRUE(r) << "reply " << i << " of the burst never came";
    EXPECT_EQ(r->number, i);
  }

  // One record per request, all written before any reply is read.
  for (int i = 0; i < kBurst; ++i) peer->send(framed(store::Request{store::Op::kAdd, 1, {"n"}, {}}));
  for (int i = kBurst + 1; i <= 2 * kBurst; ++i) {
    auto r = peer->reply();
    ASSERT_TRUE(r) << "reply " << i << " never came";
    EXPECT_EQ(r->number, i);
  }
}

}  // namespace
