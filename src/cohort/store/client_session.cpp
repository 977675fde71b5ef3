#include "cohort/store/client_session.h"

#include <algorithm>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <openssl/crypto.h>

#include "cohort/errors.h"
#include "cohort/store/wire.h"

namespace cohort::store {
namespace {

using net::Clock;

// Note [Accepted is answered]: in TLS 1.3 the client's handshake is over once it
// has sent its Finished, which the server has not read yet; a server under a flood
// of strangers could still drop the connection then, and the client would take the
// close of its first real request for a store that went away. So the session opens
// with a request (NUM_KEYS) whose answer shows that the server took it; a close
// before that answer is a dropped handshake, tried again within the timeout.
//
// A failed handshake between a store and a client of which only one has the site's
// certificates: say so, rather than OpenSSL's reason alone.
void check_certificate_modes(const tls::Context& context, const tls::Session& session, const std::string& where) {
  if (!context.with_certificates() && session.peer_has_certificate())
    throw ConfigError(fmt::format("cohort: the server at {} showed a certificate ({}): it is a store that runs with "
                                  "certificates (mutual TLS) while this peer has none, or it is not cohort's "
                                  "store\n  fix: set COHORT_STORE_TLS_CA, _CERT and _KEY here as on the host of the "
                                  "store (docs/store_security.md), or check the address and port",
                                  where, session.error()));
  if (context.with_certificates() && !session.peer_has_certificate())
    throw ConfigError(fmt::format("cohort: the TLS handshake with the store at {} failed ({}); this peer has "
                                  "certificates (COHORT_STORE_TLS_*) and the store showed none: it runs without "
                                  "them, or is not cohort's store\n  fix: set COHORT_STORE_TLS_CA, _CERT and _KEY "
                                  "on every host of the job, or on none",
                                  where, session.error()));
  if (context.with_certificates())
    throw ConfigError(fmt::format("cohort: the TLS handshake with the store at {} failed: {}\n  fix: give every host "
                                  "of the job a certificate and key of one CA, and that CA in COHORT_STORE_TLS_CA",
                                  where, session.error()));
}

// Note [Certificates and the token]: the server's answer to our proof is its own.
void check_servers_proof(const tls::Session& session, const Reply& answer, const std::string& where) {
  if (answer.status == Status::kError && answer.values.size() == 1)
    throw ConfigError(fmt::format("cohort: the store at {} refused this peer: {}", where,
                                  std::string(answer.values[0].begin(), answer.values[0].end())));
  const Bytes expected = session.token_proof(tls::Role::kServer);
  if (answer.status != Status::kOk || answer.values.size() != 1 || answer.values[0].size() != expected.size() ||
      CRYPTO_memcmp(answer.values[0].data(), expected.data(), expected.size()) != 0)
    throw ConfigError(fmt::format("cohort: the store at {} holds a certificate of this job's CA but a different "
                                  "token\n  fix: pass the job's --rdzv-token / COHORT_RDZV_TOKEN on every host",
                                  where));
}

// The handshake over a connected socket. nullopt when the server dropped the
// connection or went quiet, which is worth another try: it had too many peers
// mid-handshake, or was stopping. Throws when it answered but must not be used.
std::unique_ptr<tls::Session> handshake_over(const tls::Context& context, int fd, const std::string& where,
                                             Clock::time_point deadline, std::string& last_error,
                                             int& closed_after_handshake) {
  auto session = std::make_unique<tls::Session>(context, fd);
  switch (session->handshake(deadline)) {
    case net::Io::kDone: break;
    case net::Io::kTimedOut: last_error = "the TLS handshake did not complete"; return nullptr;
    case net::Io::kClosed: last_error = "the server closed the connection during the handshake"; return nullptr;
    case net::Io::kFailed:
      check_certificate_modes(context, *session, where);
      if (session->wrong_key())
        throw ConfigError(fmt::format("cohort: the store at {} holds a different token: pass the job's "
                                      "--rdzv-token / COHORT_RDZV_TOKEN",
                                      where));
      throw CommError(fmt::format("cohort: the store at {} failed the TLS handshake ({}): it is not cohort's store, "
                                  "or runs another version of cohort\n  fix: check the rendezvous address and port, "
                                  "and run the same cohort on every host of the job",
                                  where, session->error()));
  }
  const bool certificates = context.with_certificates();
  // Note [Store protocol]: only the key proves the server; a certificate never does,
  // unless the site gave certificates (Note [Certificates and the token]).
  if (certificates ? !session->peer_verified() : !session->used_the_key())
    throw CommError(fmt::format("cohort: the store at {} failed to prove that it holds the token; something else "
                                "answers at that address\n  fix: check the rendezvous address and port",
                                where));
  // Note [Accepted is answered]: TLS 1.3 ends on the client's side before the server
  // has read the client's last message, so one request confirms the server took us.
  // With certificates that request is the proof of the token.
  auto probe = frame(encode(certificates ? Request{Op::kProve, 0, {}, {session->token_proof(tls::Role::kClient)}}
                                         : Request{Op::kNumKeys, 0, {}, {}}));
  std::uint8_t header[kFrameHeaderSize];
  auto io = session->write_all(probe.data(), probe.size(), deadline);
  if (io == net::Io::kDone) io = session->read_exact(header, sizeof header, deadline);
  // The first reply is small: NUM_KEYS's, or the server's proof (or an error).
  constexpr std::size_t kFirstReplyBytes = 64 * 1024;
  if (io == net::Io::kDone && framed_size(header) > kFirstReplyBytes)
    throw CommError(fmt::format("cohort: the store at {} announced a first reply of {} bytes; run the same cohort "
                                "on every host of the job",
                                where, framed_size(header)));
  Bytes reply(io == net::Io::kDone ? framed_size(header) : 0);
  if (io == net::Io::kDone) io = session->read_exact(reply.data(), reply.size(), deadline);
  // TLS 1.3: the server checks a client's certificate after the client's handshake
  // is over, so its refusal (an alert) arrives here.
  if (io == net::Io::kFailed && certificates)
    throw ConfigError(fmt::format("cohort: the store at {} refused this peer's certificate ({})\n  fix: give every "
                                  "host of the job a certificate of the CA in the store's COHORT_STORE_TLS_CA, valid "
                                  "for both TLS client and server use",
                                  where, session->error()));
  // Note [A refusal without its alert]: the store sends its alert and closes; when
  // our first request reached it before the close, the kernel may reset the
  // connection or end it before the alert is read, and we see a plain close. A store
  // that is stopping closes so too, once; one that does so again and again refused
  // us, and waiting for the connect timeout would only hide why.
  if (io == net::Io::kClosed && certificates && ++closed_after_handshake >= 3)
    throw ConfigError(fmt::format("cohort: the store at {} refused this peer's certificate (it closed the connection "
                                  "right after the TLS handshake, {} times; its alert was lost)\n  fix: give every "
                                  "host of the job a certificate of the CA in the store's COHORT_STORE_TLS_CA, valid "
                                  "for both TLS client and server use",
                                  where, closed_after_handshake));
  if (io != net::Io::kDone) {
    last_error = io == net::Io::kTimedOut ? "the server did not answer its first request"
                                          : "the server closed the connection after the handshake";
    return nullptr;
  }
  auto answer = decode_reply(reply);
  if (!answer)
    throw CommError(fmt::format("cohort: the store at {} answered its first request with nonsense; run the same "
                                "cohort on every host of the job",
                                where));
  if (certificates) check_servers_proof(*session, *answer, where);
  return session;
}

}  // namespace

ClientSession open_session(const std::string& host, int port, const std::string& token,
                           std::chrono::milliseconds timeout, const Certificates& certificates) {
  const auto deadline = Clock::now() + timeout;
  const auto where = fmt::format("{}:{}", host, port);
  auto context = std::make_unique<tls::Context>(tls::Role::kClient, token, certificates);
  std::string last_error;
  int closed_after_handshake = 0;
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    if (auto fd = net::connect_once(host, port, deadline, last_error))
      if (auto tls = handshake_over(*context, fd.get(), where, deadline, last_error, closed_after_handshake))
        return ClientSession{std::move(context), std::move(fd), std::move(tls)};
    auto now = Clock::now();
    if (now >= deadline)
      throw TimeoutError(fmt::format("cohort: no store answered at {} within {:.1f} s (last attempt: {})\n  fix: is "
                                     "the agent that hosts the rendezvous running? check the host and port, and "
                                     "that this host can reach them",
                                     where, std::chrono::duration<double>(timeout).count(), last_error),
                         "connect to store", {});
    // Backing off between attempts, not synchronising: the server may start any time.
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

}  // namespace cohort::store
