// The store with a site's certificates (Note [Certificates and the token]): mutual
// TLS under the site's CA, and the job's token proved inside the channel, so that
// a certificate alone admits nobody to a job, and a peer without one gets a clear
// error on both ends.
#include <gtest/gtest.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <thread>

#include "cohort/errors.h"
#include "cohort/store/certificates.h"
#include "cohort/store/store_client.h"
#include "cohort/store/store_server.h"
#include "cohort/store/tls.h"
#include "cohort/store/wire.h"
#include "cohort/util/bytes.h"
#include "store/raw_peer.h"
#include "support/test_pki.h"

namespace {
namespace store = cohort::store;
namespace tls = cohort::store::tls;
using cohort::testing::TestPki;
using cohort::util::from_bytes;
using cohort::util::to_bytes;
using store::net::Clock;
using store::net::Io;
using namespace std::chrono_literals;

const std::string kToken = "the-job-token-5be2a9";

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A server with the site's certificates, whose refusals a test can read.
struct CertifiedServer {
  std::mutex mutex;
  std::vector<std::string> reasons;
  store::StoreServer server;
  explicit CertifiedServer(const store::Certificates& certificates, std::chrono::milliseconds handshake = 1s)
      : server(store::StoreServerOptions(kToken)
                   .certificates(certificates)
                   .handshake_timeout(handshake)
                   .on_refused([this](const std::string& r) {
                     std::lock_guard<std::mutex> lock(mutex);
                     reasons.push_back(r);
                   })) {}
  std::string refusals(std::int64_t at_least) {
    auto deadline = Clock::now() + 10s;
    while (server.refused() < at_least && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
    std::lock_guard<std::mutex> lock(mutex);
    std::string out;
    for (auto& r : reasons) out += r + "\n";
    return out;
  }
};

// What a client's connection attempt threw, or "" when it got in.
std::string connect_error(int port, const std::string& token, const store::Certificates& certificates) {
  try {
    store::StoreClient client("127.0.0.1", port, token, 5s, certificates);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

TEST(StoreCertificates, PeersOfTheSitesCaHoldingTheTokenGetInWithForwardSecrecy) {
  TestPki pki;
  const auto server_side = pki.issue("store-host");
  tls::Context server(tls::Role::kServer, kToken, server_side);
  tls::Context client(tls::Role::kClient, kToken, pki.issue("worker-host"));
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  {
    tls::Session c(client, fds[0]);
    tls::Session s(server, fds[1]);
    Io server_result = Io::kFailed;
    std::thread server_thread([&] {
      server_result = s.handshake(Clock::now() + 10s);
      std::uint8_t byte = 0;
      if (server_result == Io::kDone) server_result = s.read_exact(&byte, 1, Clock::now() + 10s);
    });
    ASSERT_EQ(c.handshake(Clock::now() + 10s), Io::kDone) << c.error();
    const std::uint8_t byte = 1;
    ASSERT_EQ(c.write_all(&byte, 1, Clock::now() + 10s), Io::kDone);
    server_thread.join();
    ASSERT_EQ(server_result, Io::kDone) << s.error();
    EXPECT_TRUE(c.peer_verified());
    EXPECT_TRUE(s.peer_verified());
    EXPECT_FALSE(c.used_the_key()) << "TLS 1.3 authenticates by a PSK or by certificates, not both";
    EXPECT_FALSE(c.key_exchange_group().empty()) << "no ephemeral key exchange: no forward secrecy";
    EXPECT_EQ(SSL_version(c.native()), TLS1_3_VERSION);
    // Both ends export the same proofs, one per direction, and they follow the token.
    EXPECT_EQ(c.token_proof(tls::Role::kClient), s.token_proof(tls::Role::kClient));
    EXPECT_EQ(c.token_proof(tls::Role::kServer), s.token_proof(tls::Role::kServer));
    EXPECT_NE(c.token_proof(tls::Role::kClient), c.token_proof(tls::Role::kServer));
  }
  ::close(fds[0]);
  ::close(fds[1]);

  CertifiedServer store_server(server_side);
  store::StoreClient a("127.0.0.1", store_server.server.port(), kToken, 5s, pki.issue("agent-host"));
  a.set("k", to_bytes("v"));
  auto b = a.clone();
  EXPECT_EQ(from_bytes(b->get("k")), "v");
  EXPECT_EQ(store_server.server.refused(), 0) << store_server.refusals(0);
}

// Two jobs of one site share a CA; the token keeps them apart.
TEST(StoreCertificates, ACertificateOfTheSitesCaWithAnotherTokenIsRefused) {
  TestPki pki;
  CertifiedServer s(pki.issue("store-host"));
  auto error = connect_error(s.server.port(), "another-jobs-token-11", pki.issue("other-job-host"));
  EXPECT_TRUE(contains(error, "different tokens")) << error;
  EXPECT_TRUE(contains(error, "COHORT_RDZV_TOKEN")) << error;
  auto reasons = s.refusals(1);
  EXPECT_TRUE(contains(reasons, "different tokens")) << reasons;
}

TEST(StoreCertificates, ACertificateOfAnotherCaIsRefusedOnBothEnds) {
  TestPki site, stranger("a-strangers-ca");
  CertifiedServer s(site.issue("store-host"));
  auto forged = stranger.issue("intruder");
  forged.ca_file = site.ca_file();  // it trusts the site's CA, but its certificate is not from it
  const auto started = Clock::now();
  auto error = connect_error(s.server.port(), kToken, forged);
  // Refused at once, not after the connect timeout: with the store's alert, or, when
  // the store closed with the peer's handshake data unread and the kernel reset the
  // connection before the alert was read (seen once in CI's LibTorch 2.6 leg), with
  // the reset, or after a few plain closes (Note [A refusal without its alert]; 3 of
  // 8 runs against PyPI's torch 2.11 waited out the 5 s connect timeout before).
  EXPECT_TRUE(contains(error, "refused this peer's certificate (tlsv1 alert unknown ca)") ||
              contains(error, "refused this peer's certificate (Connection reset by peer)") ||
              contains(error, "refused this peer's certificate (it closed the connection right after the TLS "
                              "handshake"))
      << error;
  EXPECT_LT(Clock::now() - started, 4s) << error;
  auto reasons = s.refusals(1);
  EXPECT_TRUE(contains(reasons, "certificate verify failed")) << reasons;
  EXPECT_TRUE(contains(reasons, "COHORT_STORE_TLS_CA")) << reasons;
  // And a client that trusts only the site's CA refuses a store of another CA.
  CertifiedServer fake(stranger.issue("fake-store"));
  error = connect_error(fake.server.port(), kToken, site.issue("worker-host"));
  EXPECT_TRUE(contains(error, "certificate verify failed")) << error;
}

TEST(StoreCertificates, APeerWithoutCertificatesAgainstAStoreWithThemIsToldSo) {
  TestPki pki;
  CertifiedServer s(pki.issue("store-host"));
  auto error = connect_error(s.server.port(), kToken, {});
  EXPECT_TRUE(contains(error, "a store that runs with certificates (mutual TLS) while this peer has none")) << error;
  EXPECT_TRUE(contains(error, "COHORT_STORE_TLS_CA")) << error;
  EXPECT_TRUE(contains(s.refusals(1), "certificate of its CA")) << s.refusals(1);
}

TEST(StoreCertificates, APeerWithCertificatesAgainstAStoreWithoutThemIsToldSo) {
  TestPki pki;
  store::StoreServer plain{store::StoreServerOptions(kToken)};
  auto error = connect_error(plain.port(), kToken, pki.issue("worker-host"));
  EXPECT_TRUE(contains(error, "the store showed none")) << error;
  EXPECT_TRUE(contains(error, "on every host of the job, or on none")) << error;
}

// A peer of the site's CA must still prove the token, first and in time.
TEST(StoreCertificates, APeerThatSkipsOrDelaysTheProofIsCutOff) {
  TestPki pki;
  CertifiedServer s(pki.issue("store-host"), 300ms);
  tls::Context context(tls::Role::kClient, kToken, pki.issue("rude-host"));
  auto handshaken = [&](int fd) {
    auto session = std::make_unique<tls::Session>(context, fd);
    EXPECT_EQ(session->handshake(Clock::now() + 10s), Io::kDone) << session->error();
    return session;
  };
  // A SET where the proof belongs: an error naming it, then the close.
  int fd = cohort::testing::connect_raw(s.server.port());
  auto rude = handshaken(fd);
  auto set = store::frame(store::encode(store::Request{store::Op::kSet, 0, {"k"}, {to_bytes("v")}}));
  ASSERT_EQ(rude->write_all(set.data(), set.size(), Clock::now() + 10s), Io::kDone);
  std::uint8_t header[store::kFrameHeaderSize];
  ASSERT_EQ(rude->read_exact(header, sizeof header, Clock::now() + 10s), Io::kDone);
  store::Bytes payload(store::framed_size(header));
  ASSERT_EQ(rude->read_exact(payload.data(), payload.size(), Clock::now() + 10s), Io::kDone);
  auto reply = store::decode_reply(payload);
  ASSERT_TRUE(reply && reply->status == store::Status::kError);
  EXPECT_TRUE(contains(from_bytes(reply->values.at(0)), "a SET request out of place")) << from_bytes(reply->values[0]);
  rude.reset();
  ::close(fd);
  // Silence after the handshake: dropped at the handshake deadline.
  int silent_fd = cohort::testing::connect_raw(s.server.port());
  auto silent = handshaken(silent_fd);
  EXPECT_TRUE(cohort::testing::closed_by_peer(silent_fd, 10s));
  auto reasons = s.refusals(2);
  EXPECT_TRUE(contains(reasons, "did not finish the handshake within 0.3 s")) << reasons;
  silent.reset();
  ::close(silent_fd);
  // Nothing was written by either.
  store::StoreClient good("127.0.0.1", s.server.port(), kToken, 5s, pki.issue("good-host"));
  EXPECT_FALSE(good.check({"k"}));
}

TEST(StoreCertificates, VariablesSetInPartOrFilesThatDoNotLoadAreNamed) {
  TestPki pki;
  const auto host = pki.issue("host");
  try {
    (void)store::certificates_from({{store::kCaVariable, host.ca_file}, {store::kCertVariable, host.cert_file}});
    FAIL() << "a certificate without its key was taken";
  } catch (const cohort::ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "COHORT_STORE_TLS_KEY is not set")) << e.what();
  }
  EXPECT_FALSE(store::certificates_from({}).enabled());
  auto relative = store::certificates_from({{store::kCaVariable, "ca.pem"},
                                            {store::kCertVariable, "host.pem"},
                                            {store::kKeyVariable, "host.key"}});
  EXPECT_EQ(relative.ca_file.front(), '/') << "workers may run elsewhere: paths are made absolute";

  auto expect_refused = [](const store::Certificates& c, const std::string& part) {
    try {
      tls::Context context(tls::Role::kServer, kToken, c);
      ADD_FAILURE() << "loaded: " << part;
    } catch (const cohort::ConfigError& e) {
      EXPECT_TRUE(contains(e.what(), part)) << e.what();
    }
  };
  auto missing = host;
  missing.cert_file += ".missing";
  expect_refused(missing, "COHORT_STORE_TLS_CERT=" + missing.cert_file);
  auto other_key = host;
  other_key.key_file = pki.issue("another-host").key_file;
  expect_refused(other_key, "is not the key of its certificate");
  auto encrypted = host;
  encrypted.key_file = pki.encrypted_key();
  expect_refused(encrypted, "a key under a passphrase is not supported");
  auto not_pem = host;
  std::ofstream(pki.ca_file() + ".txt") << "not a certificate\n";
  not_pem.ca_file = pki.ca_file() + ".txt";
  expect_refused(not_pem, "COHORT_STORE_TLS_CA=");
}

}  // namespace
