// The store server's side of one connection: the TLS handshake, then frames in and
// out (Note [Store protocol] in store/wire.h). Part of ServerLoop.
#include <errno.h>
#include <sys/socket.h>

#include <algorithm>

#include <fmt/format.h>
#include <openssl/crypto.h>

#include "cohort/store/server_loop.h"

namespace cohort::store {

using net::Clock;

namespace {

// Why a handshake that OpenSSL failed was refused, for the server's report.
std::string handshake_refusal(const tls::Context& context, const tls::Session& s) {
  if (context.with_certificates())
    return fmt::format("its TLS handshake failed ({}); this store admits only peers that show a certificate of its "
                       "CA (COHORT_STORE_TLS_CA, _CERT and _KEY, set on every host of the job)",
                       s.error());
  if (s.wrong_key()) return "it holds a different token";
  const std::string& offered = s.offered_identity();
  if (!offered.empty() && offered != tls::kPskIdentity)
    return fmt::format("it speaks store protocol '{}', this server '{}' (another version of cohort)", offered,
                       tls::kPskIdentity);
  if (offered.empty()) return fmt::format("its TLS handshake offered no cohort key ({})", s.error());
  return fmt::format("its TLS handshake failed: {}", s.error());
}

}  // namespace

void ServerLoop::on_readable(Connection& c) {
  if (c.lingering) return drop_input(c);
  if (c.closing) {
    c.dead = true;  // only a hang-up or an error wakes a closing connection
    return;
  }
  if (!c.tls) return start_tls(c);
  if (!c.authenticated) return continue_handshake(c);
  read_frames(c);
}

void ServerLoop::start_tls(Connection& c) {
  // Note [Store protocol]: the first byte tells a TLS peer from one that is not;
  // the latter is closed without a byte in reply.
  std::uint8_t first = 0;
  ssize_t got = ::recv(c.fd.get(), &first, 1, MSG_PEEK);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (got <= 0) {
    c.dead = true;  // it left; that is no refusal
    return;
  }
  if (first != tls::kHandshakeRecord)
    return refuse(c, "it does not speak TLS, so not cohort's store protocol: a stock c10d TCPStore client (a worker "
                     "that calls init_process_group with env:// itself), or a port scan; closed without a reply");
  c.tls = std::make_unique<tls::Session>(tls_, c.fd.get());
  continue_handshake(c);
}

void ServerLoop::continue_handshake(Connection& c) {
  c.want_write = false;
  const auto step = c.tls->step_handshake();
  // The key was accepted: the client's binder verified (Note [Pending handshakes
  // under a flood]).
  if (step != tls::Step::kFailed && c.tls->used_the_key()) c.proved = true;
  switch (step) {
    case tls::Step::kDone: break;
    case tls::Step::kWantRead: return;
    case tls::Step::kWantWrite: c.want_write = true; return;
    case tls::Step::kClosed: c.dead = true; return;  // it left
    case tls::Step::kFailed: return refuse(c, handshake_refusal(tls_, *c.tls));
  }
  if (tls_.with_certificates()) {
    // Note [Certificates and the token]: OpenSSL has checked the chain (and fails a
    // handshake without one); the token's proof is the session's first request.
    if (!c.tls->peer_verified()) return refuse(c, "its certificate did not verify against the store's CA");
    c.awaiting_proof = true;
  } else if (!c.tls->used_the_key()) {
    // Without a certificate the handshake cannot complete otherwise; checked all the same.
    return refuse(c, "its TLS handshake did not use the job's key");
  }
  c.authenticated = true;
  read_frames(c);  // a request may have come with the client's Finished
}

void ServerLoop::read_frames(Connection& c) {
  // Bounded per wake-up, so one busy peer cannot starve the others: what is left in
  // the socket is reported again by epoll (level-triggered), and what OpenSSL still
  // holds decrypted is read on the next round (Note [Buffered TLS plaintext]).
  std::uint8_t chunk[64 * 1024];
  for (int i = 0; i < 16 && !c.dead && !c.closing; ++i) {
    std::size_t got = 0;
    c.want_write = false;
    switch (c.tls->read_some(chunk, sizeof chunk, got)) {
      case tls::Step::kDone: break;
      case tls::Step::kWantRead: return;
      case tls::Step::kWantWrite: c.want_write = true; return;
      case tls::Step::kClosed:
      case tls::Step::kFailed: c.dead = true; return;  // gone, or a record that fails authentication
    }
    if (c.awaiting_proof && c.in.size() + got > kBeforeProofBytes)
      return fail_connection(c, fmt::format("cohort: this connection sent {} bytes before proving the token, over "
                                            "the store's limit of {} (one PROVE request)",
                                            c.in.size() + got, kBeforeProofBytes));
    // Note [Buffers per connection]: a client has one request in flight, so it
    // never needs more than one request's bytes buffered here.
    if (c.in.size() + got > options_.max_buffer_bytes()) {
      return fail_connection(
          c, c.parked ? fmt::format("cohort: this connection sent {} bytes while its {} request waited, over the "
                                    "store's limit of {} bytes per connection (StoreServerOptions::max_buffer_bytes); "
                                    "a client sends one request at a time and waits for its reply",
                                    c.in.size() + got, op_name(c.parked->op), options_.max_buffer_bytes())
                      : fmt::format("cohort: this connection sent {} bytes that make no whole request, over the "
                                    "store's limit of {} bytes per connection (StoreServerOptions::max_buffer_bytes)",
                                    c.in.size() + got, options_.max_buffer_bytes()));
    }
    c.in.insert(c.in.end(), chunk, chunk + got);
    process_frames(c);
  }
}

void ServerLoop::process_frames(Connection& c) {
  const std::size_t limit = std::min(kMaxFramePayload, options_.max_buffer_bytes() - kFrameHeaderSize);
  std::size_t pos = 0;
  std::string failure;
  while (!c.dead && !c.closing && !c.parked && c.in.size() - pos >= kFrameHeaderSize) {
    const std::size_t size = framed_size(c.in.data() + pos);
    if (size > limit) {
      failure = fmt::format("cohort: a store request of {} bytes is over the store's limit of {} bytes per request "
                            "(StoreServerOptions::max_buffer_bytes); store smaller values",
                            size, limit);
      break;
    }
    if (c.in.size() - pos - kFrameHeaderSize < size) break;
    auto request = decode_request(c.in.data() + pos + kFrameHeaderSize, size);
    pos += kFrameHeaderSize + size;
    if (!request) {
      failure = fmt::format("cohort: the store received a malformed request (an unknown op, the wrong number of keys "
                            "or values for it, or more than {} of either); run the same cohort on every host of "
                            "the job, and name fewer keys at once",
                            kMaxItemsPerList);
      break;
    }
    handle(c, std::move(*request));
  }
  // A request that failed the connection (a PROVE out of place, a wrong proof) has
  // emptied the input already (fail_connection): nothing of it is left to erase.
  pos = std::min(pos, c.in.size());
  c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(pos));
  if (!failure.empty()) fail_connection(c, failure);
}

void ServerLoop::handle(Connection& c, Request request) {
  if (c.awaiting_proof || request.op == Op::kProve) return check_proof(c, request);
  if (auto r = table_.apply(request)) {
    note_write(request);
    return reply(c, *r);
  }
  park(c, std::move(request));
}

void ServerLoop::reply(Connection& c, const Reply& r) {
  auto payload = encode(r);
  const std::size_t limit = std::min(kMaxFramePayload, options_.max_buffer_bytes() - kFrameHeaderSize);
  if (payload.size() > limit) {
    // Too big to send (a MULTI_GET of many large values): an error for this request,
    // rather than an exception that would stop the whole server.
    Reply error;
    error.status = Status::kError;
    auto message = fmt::format("cohort: a store reply of {} bytes is over the store's limit of {} bytes per reply "
                               "(StoreServerOptions::max_buffer_bytes); fetch fewer keys at once",
                               payload.size(), limit);
    error.values.emplace_back(message.begin(), message.end());
    payload = encode(error);
  }
  if (c.out.size() + kFrameHeaderSize + payload.size() > options_.max_buffer_bytes()) {
    // Note [Buffers per connection]: replies pile up only when the peer stops reading.
    count_refusal(fmt::format("cohort store: closed {}: it left {} bytes of replies unread, and the next would pass "
                              "the store's limit of {} bytes per connection (StoreServerOptions::max_buffer_bytes)",
                              c.peer, c.out.size(), options_.max_buffer_bytes()));
    c.dead = true;
    return;
  }
  auto bytes = frame(payload);
  c.out.insert(c.out.end(), bytes.begin(), bytes.end());
  flush(c);
}

void ServerLoop::flush(Connection& c) {
  std::size_t sent = 0;
  c.want_write = false;
  while (sent < c.out.size() && !c.dead) {
    std::size_t n = 0;
    auto step = c.tls->write_some(c.out.data() + sent, c.out.size() - sent, n);
    sent += n;
    if (step == tls::Step::kDone) continue;
    if (step == tls::Step::kWantWrite) c.want_write = true;
    if (step == tls::Step::kClosed || step == tls::Step::kFailed) c.dead = true;
    break;  // kWantRead: the next readable event goes on
  }
  c.out.erase(c.out.begin(), c.out.begin() + static_cast<std::ptrdiff_t>(sent));
  if (c.closing && !c.lingering && c.out.empty() && !c.dead) {
    // Note [Closing with an error].
    c.tls->shutdown();
    ::shutdown(c.fd.get(), SHUT_WR);
    c.lingering = true;
    c.linger_until = Clock::now() + kLinger;
  }
}

void ServerLoop::drop_input(Connection& c) {
  std::uint8_t sink[64 * 1024];
  for (int i = 0; i < 16; ++i) {
    ssize_t got = ::recv(c.fd.get(), sink, sizeof sink, 0);
    if (got > 0) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    c.dead = true;  // the peer closed too
    return;
  }
}

void ServerLoop::fail_connection(Connection& c, const std::string& message) {
  // Reported like a refusal, and answered in place of the reply the client awaits
  // (its parked request's, or the one it is sending); then closed once sent.
  count_refusal(fmt::format("cohort store: closed {}: {}", c.peer, message));
  unpark(c);
  Bytes().swap(c.in);
  Reply error;
  error.status = Status::kError;
  error.number = kConnectionClosing;
  error.values.emplace_back(message.begin(), message.end());
  c.closing = true;
  auto bytes = frame(encode(error));
  c.out.insert(c.out.end(), bytes.begin(), bytes.end());
  flush(c);
}

// Note [Certificates and the token]: the client's proof comes first and only once;
// the server shows its own only after the client's checked out.
void ServerLoop::check_proof(Connection& c, const Request& request) {
  const bool in_place = c.awaiting_proof && request.op == Op::kProve;
  c.awaiting_proof = false;  // either way: proved now, or closing (counted once)
  if (!in_place)
    return fail_connection(c, fmt::format("cohort: a {} request out of place: a session proves the token once, "
                                          "first, and only when the store has certificates; run the same cohort "
                                          "on every host of the job",
                                          op_name(request.op)));
  const Bytes expected = c.tls->token_proof(tls::Role::kClient);
  const Bytes& given = request.values[0];
  if (given.size() != expected.size() || CRYPTO_memcmp(given.data(), expected.data(), given.size()) != 0)
    return fail_connection(c, "cohort: the peer and the store hold different tokens (the peer's certificate is of "
                              "the store's CA, but its proof of the token failed)\n  fix: pass the job's --rdzv-token / "
                              "COHORT_RDZV_TOKEN on every host");
  c.proved = true;
  Reply r;
  r.values.push_back(c.tls->token_proof(tls::Role::kServer));
  reply(c, r);
}

void ServerLoop::refuse(Connection& c, const std::string& reason) {
  count_refusal(fmt::format("cohort store: refused {}: {}", c.peer, reason));
  c.dead = true;
}

}  // namespace cohort::store
