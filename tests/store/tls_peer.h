#pragma once
// A raw socket that completes the store's TLS handshake with a token and then
// sends and receives whatever a test wants inside it: forged or pipelined
// requests, or nothing at all after the handshake. Every read and write is bounded
// (10 s).
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "cohort/store/tls.h"
#include "cohort/store/wire.h"
#include "store/raw_peer.h"

namespace cohort::testing {

struct HandRolled {
  int fd = -1;
  std::unique_ptr<store::tls::Context> context;
  std::unique_ptr<store::tls::Session> session;
  HandRolled() = default;
  HandRolled(const HandRolled&) = delete;
  HandRolled& operator=(const HandRolled&) = delete;
  ~HandRolled() {
    session.reset();
    if (fd >= 0) ::close(fd);
  }
  void send(const store::Bytes& plaintext) {
    EXPECT_EQ(session->write_all(plaintext.data(), plaintext.size(), deadline()), store::net::Io::kDone);
  }
  // The next reply, or nullopt when the connection ended first.
  std::optional<store::Reply> reply() {
    std::uint8_t header[store::kFrameHeaderSize];
    if (session->read_exact(header, sizeof header, deadline()) != store::net::Io::kDone) return std::nullopt;
    store::Bytes payload(store::framed_size(header));
    if (session->read_exact(payload.data(), payload.size(), deadline()) != store::net::Io::kDone) return std::nullopt;
    return store::decode_reply(payload);
  }
  static store::net::Clock::time_point deadline() { return store::net::Clock::now() + std::chrono::seconds(10); }
};

inline std::unique_ptr<HandRolled> tls_peer(int port, const std::string& token) {
  auto peer = std::make_unique<HandRolled>();
  peer->fd = connect_raw(port);
  // Non-blocking, so that every read and write is bounded by the helpers' deadline.
  ::fcntl(peer->fd, F_SETFL, ::fcntl(peer->fd, F_GETFL) | O_NONBLOCK);
  peer->context = std::make_unique<store::tls::Context>(store::tls::Role::kClient, token);
  peer->session = std::make_unique<store::tls::Session>(*peer->context, peer->fd);
  EXPECT_EQ(peer->session->handshake(HandRolled::deadline()), store::net::Io::kDone) << peer->session->error();
  return peer;
}

}  // namespace cohort::testing
