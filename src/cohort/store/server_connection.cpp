// The store server's side of one connection: the handshake, then sealed frames in
// and out (Note [Store protocol] in store/wire.h). Part of ServerLoop.
#include <errno.h>
#include <sys/socket.h>

#include <algorithm>

#include <fmt/format.h>

#include "cohort/store/handshake.h"
#include "cohort/store/server_loop.h"

namespace cohort::store {

using net::Clock;

void ServerLoop::on_readable(Connection& c) {
  if (!c.authenticated) return read_hello(c);
  // Bounded per wake-up, so one busy peer cannot starve the others.
  std::uint8_t chunk[64 * 1024];
  for (int i = 0; i < 16; ++i) {
    ssize_t got = ::recv(c.fd.get(), chunk, sizeof chunk, 0);
    if (got > 0) {
      c.in.insert(c.in.end(), chunk, chunk + got);
      continue;
    }
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    c.dead = true;  // closed or failed
    return;
  }
  process_frames(c);
}

void ServerLoop::read_hello(Connection& c) {
  // Never more than a client hello from a peer that has not proved anything yet.
  const std::size_t have = c.in.size();
  c.in.resize(handshake::kClientHelloSize);
  ssize_t got = ::recv(c.fd.get(), c.in.data() + have, handshake::kClientHelloSize - have, 0);
  const int err = errno;
  c.in.resize(have + static_cast<std::size_t>(std::max<ssize_t>(got, 0)));
  if (got == 0 || (got < 0 && err != EAGAIN && err != EWOULDBLOCK && err != EINTR)) {
    c.dead = true;  // it left; that is no refusal
    return;
  }
  if (!handshake::plausible_client_hello(c.in.data(), c.in.size()))
    return refuse(c, "it does not speak cohort's store protocol (wrong magic; a TCPStore client, or a port scan?)",
                  -1);
  // Another version's hello may be longer: judge the version as soon as it is in.
  if (c.in.size() > handshake::kMagicSize && c.in[handshake::kMagicSize] != handshake::kVersion)
    return refuse(c,
                  fmt::format("it speaks store protocol version {}, this server {}", c.in[handshake::kMagicSize],
                              handshake::kVersion),
                  static_cast<int>(handshake::Verdict::kWrongVersion));
  if (c.in.size() < handshake::kClientHelloSize) return;
  Bytes client_nonce;
  switch (handshake::check_client_hello(options_.token(), c.server_nonce, c.in, client_nonce)) {
    case handshake::HelloCheck::kAccepted: break;
    case handshake::HelloCheck::kNotCohort:
    case handshake::HelloCheck::kWrongVersion: return refuse(c, "it does not speak cohort's store protocol", -1);
    case handshake::HelloCheck::kWrongToken:
      return refuse(c, "it holds a different token", static_cast<int>(handshake::Verdict::kWrongToken));
  }
  auto keys = handshake::session_keys(options_.token(), c.server_nonce, client_nonce);
  c.sealer = std::make_unique<FrameSealer>(keys.server_to_client);
  c.opener = std::make_unique<FrameOpener>(keys.client_to_server);
  c.out.push_back(static_cast<std::uint8_t>(handshake::Verdict::kAccepted));
  auto proof = handshake::server_proof(options_.token(), c.server_nonce, client_nonce);
  c.out.insert(c.out.end(), proof.begin(), proof.end());
  c.in.clear();
  c.authenticated = true;
  flush(c);
}

void ServerLoop::process_frames(Connection& c) {
  std::size_t pos = 0;
  while (!c.dead && !c.parked && c.in.size() - pos >= kFrameHeaderSize) {
    auto size = FrameOpener::frame_size(c.in.data() + pos);
    if (!size) {
      c.dead = true;  // a length over the limit: not a frame our client would send
      return;
    }
    if (c.in.size() - pos < *size) break;
    auto payload = c.opener->open(c.in.data() + pos, *size);
    pos += *size;
    auto request = payload ? decode_request(*payload) : std::nullopt;
    if (!request) {
      c.dead = true;  // forged, replayed or malformed
      return;
    }
    handle(c, std::move(*request));
  }
  c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(pos));
}

void ServerLoop::handle(Connection& c, Request request) {
  if (auto r = table_.apply(request)) return reply(c, *r);
  // A year bounds the deadline arithmetic; the client bounds the wait it asked for.
  auto wait = std::chrono::milliseconds(std::clamp<std::int64_t>(request.number, 0, 365LL * 24 * 3600 * 1000));
  c.parked_deadline = Clock::now() + wait;
  c.parked = std::move(request);
}

void ServerLoop::reply(Connection& c, const Reply& r) {
  auto payload = encode(r);
  if (payload.size() > kMaxFramePayload) {
    // Too big for one frame (a MULTI_GET of many large values): an error for this
    // request, rather than an exception that would stop the whole server.
    Reply error;
    error.status = Status::kError;
    auto message = fmt::format("cohort: a store reply of {} bytes exceeds the protocol's limit of {} bytes; fetch "
                               "fewer keys at once",
                               payload.size(), kMaxFramePayload);
    error.values.emplace_back(message.begin(), message.end());
    payload = encode(error);
  }
  auto frame = c.sealer->seal(payload);
  c.out.insert(c.out.end(), frame.begin(), frame.end());
  flush(c);
}

void ServerLoop::flush(Connection& c) {
  std::size_t sent = 0;
  while (sent < c.out.size()) {
    ssize_t n = ::send(c.fd.get(), c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;
      break;
    }
  }
  c.out.erase(c.out.begin(), c.out.begin() + static_cast<std::ptrdiff_t>(sent));
}

void ServerLoop::refuse(Connection& c, const std::string& reason, int verdict) {
  // Counted and reported before the peer can learn of it, so that whoever sees the
  // refusal sees it counted too.
  count_refusal(fmt::format("cohort store: refused {}: {}", c.peer, reason));
  if (verdict >= 0) {
    // Best effort: a fresh socket's send buffer has room for one byte.
    auto byte = static_cast<std::uint8_t>(verdict);
    (void)::send(c.fd.get(), &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  c.dead = true;
}

}  // namespace cohort::store
