// Who gets in: only peers holding the token; strangers, forgers and the slow are
// dropped and counted while the server keeps serving; nothing secret is readable on
// the wire; the listener is where it was told to be.
#include <gtest/gtest.h>
#include <ifaddrs.h>

#include <mutex>

#include "cohort/errors.h"
#include "cohort/store/frame_cipher.h"
#include "cohort/store/handshake.h"
#include "cohort/store/server_loop.h"
#include "cohort/store/store_client.h"
#include "cohort/store/store_server.h"
#include "cohort/store/wire.h"
#include "cohort/util/bytes.h"
#include "store/raw_peer.h"

namespace {
namespace hs = cohort::store::handshake;
using cohort::store::StoreClient;
using cohort::store::StoreServer;
using cohort::store::StoreServerOptions;
using cohort::testing::closed_by_peer;
using cohort::testing::connect_raw;
using cohort::testing::recv_raw;
using cohort::testing::send_raw;
using cohort::util::from_bytes;
using cohort::util::to_bytes;
using namespace std::chrono_literals;

const std::string kToken = "the-right-token-7c1e";

// A server whose refusals a test can read.
struct Watched {
  std::mutex mutex;
  std::vector<std::string> reasons;
  StoreServer server;
  explicit Watched(StoreServerOptions options)
      : server(options.on_refused([this](const std::string& r) {
          std::lock_guard<std::mutex> lock(mutex);
          reasons.push_back(r);
        })) {}
  explicit Watched() : Watched(StoreServerOptions(kToken)) {}
  std::string all_reasons() {
    std::lock_guard<std::mutex> lock(mutex);
    std::string out;
    for (auto& r : reasons) out += r + "\n";
    return out;
  }
  c10::intrusive_ptr<StoreClient> client() {
    return c10::make_intrusive<StoreClient>("127.0.0.1", server.port(), kToken, 10s);
  }
};

// A raw socket that completes the handshake with `token`, and the keys it agreed.
struct HandRolled {
  int fd = -1;
  std::unique_ptr<cohort::store::FrameSealer> sealer;
};

HandRolled hand_rolled(int port) {
  HandRolled peer;
  peer.fd = connect_raw(port);
  auto server_nonce = hs::parse_server_hello(recv_raw(peer.fd, hs::kServerHelloSize));
  auto client_nonce = hs::random_nonce();
  send_raw(peer.fd, hs::client_hello(kToken, server_nonce, client_nonce));
  auto verdict = recv_raw(peer.fd, 1 + hs::kProofSize);
  EXPECT_EQ(verdict.at(0), static_cast<std::uint8_t>(hs::Verdict::kAccepted));
  peer.sealer = std::make_unique<cohort::store::FrameSealer>(
      hs::session_keys(kToken, server_nonce, client_nonce).client_to_server);
  return peer;
}

TEST(StoreSecurity, AWrongTokenIsRefusedCountedAndReported) {
  Watched w;
  auto good = w.client();
  try {
    StoreClient("127.0.0.1", w.server.port(), "a-wrong-token", 10s);
    FAIL() << "a wrong token got in";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("holds a different token"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("COHORT_RDZV_TOKEN"), std::string::npos) << e.what();
  }
  EXPECT_EQ(w.server.refused(), 1);
  EXPECT_NE(w.all_reasons().find("127.0.0.1:"), std::string::npos) << w.all_reasons();
  EXPECT_NE(w.all_reasons().find("different token"), std::string::npos) << w.all_reasons();
  good->set("still", to_bytes("serving"));
  EXPECT_EQ(from_bytes(good->get("still")), "serving");
}

TEST(StoreSecurity, StrangersAreDroppedBeforeAuthentication) {
  Watched w;
  auto good = w.client();
  int http = connect_raw(w.server.port());
  send_raw(http, to_bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_TRUE(closed_by_peer(http));
  int huge = connect_raw(w.server.port());
  send_raw(huge, {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0});
  EXPECT_TRUE(closed_by_peer(huge));
  int other_version = connect_raw(w.server.port());
  recv_raw(other_version, hs::kServerHelloSize);
  auto hello = hs::client_hello(kToken, hs::random_nonce(), hs::random_nonce());
  hello[hs::kMagicSize] = hs::kVersion + 1;
  send_raw(other_version, hello);
  auto verdict = recv_raw(other_version, 1);
  EXPECT_EQ(verdict, std::vector<std::uint8_t>{static_cast<std::uint8_t>(hs::Verdict::kWrongVersion)});
  EXPECT_TRUE(closed_by_peer(other_version));
  for (int fd : {http, huge, other_version}) ::close(fd);
  EXPECT_EQ(w.server.refused(), 3) << w.all_reasons();
  EXPECT_NE(w.all_reasons().find("does not speak"), std::string::npos) << w.all_reasons();
  good->set("k", to_bytes("v"));
  EXPECT_EQ(from_bytes(good->get("k")), "v");
}

TEST(StoreSecurity, ASilentPeerIsDroppedAfterTheHandshakeTimeout) {
  Watched w(StoreServerOptions(kToken).handshake_timeout(200ms));
  int silent = connect_raw(w.server.port());
  EXPECT_TRUE(closed_by_peer(silent, 10s));
  ::close(silent);
  EXPECT_EQ(w.server.refused(), 1);
  EXPECT_NE(w.all_reasons().find("did not finish the handshake"), std::string::npos) << w.all_reasons();
}

// Note [Pending handshakes under a flood]: a full table of silent peers from one
// address takes the newcomer and drops the oldest, so a peer holding the token
// still gets in while they wait.
TEST(StoreSecurity, AFullTableOfPendingPeersEvictsTheOldestNotTheNewcomer) {
  Watched w(StoreServerOptions(kToken).handshake_timeout(60s));
  std::vector<int> idle;
  for (std::size_t i = 0; i < cohort::store::kMaxPendingPerSource; ++i) {
    idle.push_back(connect_raw(w.server.port()));
    ASSERT_EQ(recv_raw(idle.back(), hs::kServerHelloSize).size(), hs::kServerHelloSize);  // accepted
  }
  EXPECT_EQ(w.server.refused(), 0);
  int extra = connect_raw(w.server.port());
  EXPECT_EQ(recv_raw(extra, hs::kServerHelloSize).size(), hs::kServerHelloSize) << "the newcomer was turned away";
  EXPECT_TRUE(closed_by_peer(idle[0])) << "the oldest pending peer was kept";
  EXPECT_EQ(w.server.refused(), 1);
  EXPECT_NE(w.all_reasons().find("evicted to make room: 64 peers were mid-handshake (64 from 127.0.0.1)"),
            std::string::npos)
      << w.all_reasons();
  // The table is still full; a client with the token gets in all the same.
  auto good = w.client();
  good->set("k", to_bytes("v"));
  EXPECT_EQ(from_bytes(good->get("k")), "v");
  EXPECT_TRUE(closed_by_peer(idle[1]));
  EXPECT_EQ(w.server.refused(), 2);
  for (int fd : idle) ::close(fd);
  ::close(extra);
}

TEST(StoreSecurity, ForgedOversizedOrReplayedFramesCloseTheConnection) {
  Watched w;
  auto good = w.client();
  auto set_request = [](const char* key) {
    return cohort::store::encode(cohort::store::Request{cohort::store::Op::kSet, 0, {key}, {to_bytes("x")}});
  };
  auto oversized = hand_rolled(w.server.port());
  send_raw(oversized.fd, {0x7f, 0xff, 0xff, 0xff});
  EXPECT_TRUE(closed_by_peer(oversized.fd));
  auto tampered = hand_rolled(w.server.port());
  auto frame = tampered.sealer->seal(set_request("forged"));
  frame[cohort::store::kFrameHeaderSize + 2] ^= 0x01;
  send_raw(tampered.fd, frame);
  EXPECT_TRUE(closed_by_peer(tampered.fd));
  auto replayed = hand_rolled(w.server.port());
  auto once = replayed.sealer->seal(set_request("replayed"));
  send_raw(replayed.fd, once);
  send_raw(replayed.fd, once);
  EXPECT_TRUE(closed_by_peer(replayed.fd));
  for (int fd : {oversized.fd, tampered.fd, replayed.fd}) ::close(fd);
  EXPECT_FALSE(good->check({"forged"}));
  EXPECT_TRUE(good->check({"replayed"}));  // the first copy was genuine
  EXPECT_EQ(good->getNumKeys(), 1);
}

TEST(StoreSecurity, AServerWithoutTheTokenCannotPassForTheStore) {
  // An impostor listens, answers the client's hello with "accepted" and a proof it
  // cannot make without the token.
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  auto address = cohort::testing::ipv4("127.0.0.1", 0);
  ::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address);
  ::listen(listener, 1);
  socklen_t size = sizeof address;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &size);
  std::thread impostor([listener] {
    int fd = ::accept(listener, nullptr, nullptr);
    send_raw(fd, hs::server_hello(hs::random_nonce()));
    recv_raw(fd, hs::kClientHelloSize);
    auto reply = hs::random_nonce();
    reply.insert(reply.begin(), static_cast<std::uint8_t>(hs::Verdict::kAccepted));
    send_raw(fd, reply);
    closed_by_peer(fd);
    ::close(fd);
  });
  EXPECT_THROW(StoreClient("127.0.0.1", ntohs(address.sin_port), kToken, 10s), cohort::CommError);
  impostor.join();
  ::close(listener);
}

TEST(StoreSecurity, NeitherTheTokenNorKeysNorValuesCrossTheWireInClear) {
  Watched w;
  cohort::testing::Relay relay(w.server.port());
  {
    StoreClient client("127.0.0.1", relay.port(), kToken, 10s);
    client.set("secret-key-name", to_bytes("secret-value-5d2b"));
    EXPECT_EQ(from_bytes(client.get("secret-key-name")), "secret-value-5d2b");
  }
  auto wire = relay.from_client() + relay.from_server();
  ASSERT_GT(relay.from_client().size(), hs::kClientHelloSize);  // the relay saw the requests
  for (const std::string& secret : {kToken, std::string("secret-key-name"), std::string("secret-value-5d2b")})
    EXPECT_EQ(wire.find(secret), std::string::npos) << "'" << secret << "' is readable on the wire";
}

}  // namespace
