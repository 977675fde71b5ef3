// The store's TLS 1.3 (Note [Store protocol]): both ends prove the token's key, and
// every connection also runs an ephemeral key exchange, so its traffic keys are
// fresh and cannot be derived from the token: forward secrecy.
#include <gtest/gtest.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "cohort/store/tls.h"

namespace {
namespace tls = cohort::store::tls;
using cohort::store::net::Clock;
using cohort::store::net::Io;
using namespace std::chrono_literals;

// The secrets OpenSSL logs (NSS key log format: "LABEL client_random secret").
std::vector<std::string>* g_keylog = nullptr;

void log_key(const SSL*, const char* line) {
  if (g_keylog) g_keylog->push_back(line);
}

struct Handshaken {
  std::string client_group, server_group, cipher;
  bool client_used_key = false, server_used_key = false;
  int version = 0;
  Io client = Io::kFailed, server = Io::kFailed;
};

Handshaken handshake(const tls::Context& client_context, const tls::Context& server_context) {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  Handshaken out;
  {
    tls::Session client(client_context, fds[0]);
    tls::Session server(server_context, fds[1]);
    std::thread server_side([&] {
      out.server = server.handshake(Clock::now() + 10s);
      // Reads the client's first bytes, so the handshake completes on both sides.
      std::uint8_t byte = 0;
      if (out.server == Io::kDone) out.server = server.read_exact(&byte, 1, Clock::now() + 10s);
    });
    out.client = client.handshake(Clock::now() + 10s);
    const std::uint8_t byte = 1;
    if (out.client == Io::kDone) out.client = client.write_all(&byte, 1, Clock::now() + 10s);
    server_side.join();
    out.client_group = client.key_exchange_group();
    out.server_group = server.key_exchange_group();
    out.client_used_key = client.used_the_key();
    out.server_used_key = server.used_the_key();
    out.version = SSL_version(client.native());
    out.cipher = SSL_CIPHER_get_name(SSL_get_current_cipher(client.native()));
  }
  ::close(fds[0]);
  ::close(fds[1]);
  return out;
}

TEST(StoreTls, BothEndsProveTheKeyAndAgreeFreshKeysThroughAnEphemeralExchange) {
  tls::Context server(tls::Role::kServer, "the-token");
  tls::Context client(tls::Role::kClient, "the-token");
  std::vector<std::string> keylog;
  g_keylog = &keylog;
  SSL_CTX_set_keylog_callback(client.native(), log_key);
  auto first = handshake(client, server);
  auto first_secrets = keylog;
  keylog.clear();
  auto second = handshake(client, server);
  g_keylog = nullptr;

  for (const auto* h : {&first, &second}) {
    ASSERT_EQ(h->client, Io::kDone);
    ASSERT_EQ(h->server, Io::kDone);
    EXPECT_TRUE(h->client_used_key && h->server_used_key) << "a handshake completed without the token's key";
    EXPECT_EQ(h->version, TLS1_3_VERSION);
    EXPECT_EQ(h->cipher, "TLS_AES_256_GCM_SHA384");
    // psk_dhe_ke: an (EC)DHE group was negotiated, on both ends.
    EXPECT_FALSE(h->client_group.empty()) << "no ephemeral key exchange: the keys would follow from the token";
    EXPECT_EQ(h->client_group, h->server_group);
  }
  // Same token, same key: yet each connection's traffic secrets are its own.
  auto traffic_secret = [](const std::vector<std::string>& lines) {
    for (const auto& line : lines)
      if (line.rfind("CLIENT_TRAFFIC_SECRET_0 ", 0) == 0) return line.substr(line.rfind(' ') + 1);
    return std::string();
  };
  ASSERT_FALSE(traffic_secret(first_secrets).empty());
  EXPECT_NE(traffic_secret(first_secrets), traffic_secret(keylog));
  // And the key derived from the token is not what protects the traffic.
  std::string key_hex;
  for (auto b : client.key()) key_hex += "0123456789abcdef"[b >> 4], key_hex += "0123456789abcdef"[b & 15];
  for (const auto& line : first_secrets) EXPECT_EQ(line.find(key_hex), std::string::npos) << line;
}

TEST(StoreTls, DifferentTokensFailOnBothEndsAndEachSaysSo) {
  tls::Context server(tls::Role::kServer, "one-token");
  tls::Context client(tls::Role::kClient, "another-token");
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  {
    tls::Session c(client, fds[0]);
    tls::Session s(server, fds[1]);
    Io server_result = Io::kDone;
    std::thread server_side([&] { server_result = s.handshake(Clock::now() + 10s); });
    EXPECT_EQ(c.handshake(Clock::now() + 10s), Io::kFailed);
    server_side.join();
    EXPECT_EQ(server_result, Io::kFailed);
    EXPECT_TRUE(c.wrong_key()) << c.error();
    EXPECT_TRUE(s.wrong_key()) << s.error();
    EXPECT_EQ(s.offered_identity(), tls::kPskIdentity);
  }
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST(StoreTls, TheKeyIsNotTheTokenAndFollowsIt) {
  tls::Context a(tls::Role::kClient, "token-a");
  tls::Context a_again(tls::Role::kServer, "token-a");
  tls::Context b(tls::Role::kClient, "token-b");
  EXPECT_EQ(a.key(), a_again.key());
  EXPECT_NE(a.key(), b.key());
  EXPECT_EQ(a.key().size(), 48u);
  EXPECT_EQ(std::string(a.key().begin(), a.key().end()).find("token-a"), std::string::npos);
}

}  // namespace
